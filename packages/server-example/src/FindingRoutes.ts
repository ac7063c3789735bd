import { HttpRouter, HttpServerResponse } from "@effect/platform"
import { type Errors, type Findings, FindingStore, FindingsApi, Findings as Rules, type Store } from "@scanfleet/core"
import { Chunk, Effect, Option, Stream } from "effect"
import type { z } from "zod"
import { ApiError, fromNotFound, fromStoreError } from "./ApiError.js"
import * as Auth from "./Auth.js"
import * as FindingIntake from "./FindingIntake.js"
import * as Request from "./internal/Request.js"
import { Settings } from "./ServerConfig.js"
import * as Webhooks from "./Webhooks.js"

const ok = (body: unknown, status = 200) => HttpServerResponse.unsafeJson(body, { status })

/** The most findings one export writes; past it the export says so in a trailer (JSON lines) or a run property (SARIF). */
export const exportLimit = 100_000

// A server composed over a bare Store (no FindingStore in its context) serves no findings, and says why.
const findingStore = Effect.flatMap(Effect.serviceOption(FindingStore.FindingStore), (o) =>
  Option.match(o, {
    onNone: () => Effect.fail(new ApiError({ status: 501, error: "findings_unavailable", message: "this server's store keeps no findings (compose it with a FindingStore: Database.layer does)" })),
    onSome: Effect.succeed
  })
)

const storeOp = <A>(e: Effect.Effect<A, Errors.NotFound | Errors.StoreError>) =>
  Effect.mapError(e, (err) => (err._tag === "NotFound" ? fromNotFound(err) : fromStoreError(err)))

const filters = (q: z.output<typeof FindingsApi.ExportQuery>): Omit<Findings.ListQuery, "limit" | "after"> => ({
  ...(q.source !== undefined ? { source: q.source } : {}),
  ...(q.identity !== undefined ? { identity: q.identity } : {}),
  ...(q.detector !== undefined ? { detector: q.detector } : {}),
  ...(q.status !== undefined ? { status: q.status } : {}),
  ...(q.verified !== undefined ? { verified: q.verified } : {}),
  ...(q.since !== undefined ? { since: q.since } : {})
})

/** GET /v1/admin/findings: filtered, in id order, one keyset page. */
const list = Effect.gen(function* () {
  yield* Auth.admin({ cookie: true })
  const q = yield* Request.query(FindingsApi.ListQuery)
  const f = yield* findingStore
  const page = yield* storeOp(f.list({ ...filters({ ...q, format: "jsonl" }), ...(q.after !== undefined ? { after: q.after } : {}), limit: q.limit }))
  return ok({ findings: page.findings.map(Rules.view), next: page.next } satisfies z.infer<typeof FindingsApi.Page>)
})

/** GET /v1/admin/findings/target?source=&identity=&limit=&after=&scansAfter=: one keyset page of a target's findings with their history, and of its scans. */
const target = Effect.gen(function* () {
  yield* Auth.admin({ cookie: true })
  const q = yield* Request.query(FindingsApi.TargetQuery)
  const f = yield* findingStore
  const t = yield* storeOp(f.forTarget(q))
  return ok({ findings: t.findings.map(Rules.view), events: [...t.events], moreEvents: [...t.moreEvents], scans: [...t.scans], next: t.next, nextScans: t.nextScans } satisfies z.infer<typeof FindingsApi.TargetHistory>)
})

/** GET /v1/admin/findings/:id/history?after=&limit=: one keyset page of a finding's changes. */
const history = Effect.gen(function* () {
  yield* Auth.admin({ cookie: true })
  const id = yield* Request.idParam("id")
  const q = yield* Request.query(FindingsApi.HistoryQuery)
  const f = yield* findingStore
  const h = yield* storeOp(f.history({ findingId: id, ...(q.after !== undefined ? { after: q.after } : {}), limit: q.limit }))
  return ok({ events: [...h.events], next: h.next } satisfies z.infer<typeof FindingsApi.History>)
})

/** GET /v1/admin/findings/scans/:id: the summary of the scan a reservation delivered (zeros when it touched no finding). */
const scan = Effect.gen(function* () {
  yield* Auth.admin({ cookie: true })
  const id = yield* Request.idParam("id")
  const f = yield* findingStore
  const s = yield* storeOp(f.scan(id))
  return ok(s ?? { reservationId: id, new: 0, present: 0, resolved: 0, related: false })
})

/** The tool the SARIF export names. */
const tool: Findings.SarifTool = { name: "scanfleet", version: "2", informationUri: "https://github.com/scanfleet/scanfleet" }

/** Every finding matching the filters, page by page, and after the export limit one more if there is one (so the end can say the export was cut). */
const matching = (f: FindingStore.FindingStoreShape, q: Omit<Findings.ListQuery, "limit" | "after">): Stream.Stream<Findings.Finding, ApiError> =>
  Stream.paginateChunkEffect(0, (after) =>
    Effect.map(storeOp(f.list({ ...q, after, limit: 1000 })), (page) => [Chunk.unsafeFromArray([...page.findings]), Option.fromNullable(page.next)] as const)
  ).pipe(Stream.take(exportLimit + 1))

/**
 * GET /v1/admin/findings/export?format=jsonl|sarif: the filtered findings as JSON lines or a
 * SARIF 2.1.0 log, written as the store's pages are read (memory of one page, the event loop
 * free between them), up to the export limit.
 */
const exportRoute = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const q = yield* Request.query(FindingsApi.ExportQuery)
  const f = yield* findingStore
  // The first page is read before the answer starts, so a store that cannot be read is still a status.
  yield* storeOp(f.list({ ...filters(q), after: 0, limit: 1 }))
  const found = Stream.zipWithIndex(matching(f, filters(q)))
  if (q.format === "sarif") {
    const rules = new Map<string, number>()
    let truncated = false
    const result = ([finding, i]: readonly [Findings.Finding, number]) => {
      if (i >= exportLimit) {
        truncated = true
        return ""
      }
      let index = rules.get(finding.detector)
      if (index === undefined) rules.set(finding.detector, (index = rules.size))
      return `${i === 0 ? "" : ","}${JSON.stringify(Rules.sarifResult(finding, index))}`
    }
    // One string per page read, not one per finding.
    const results = found.pipe(Stream.mapChunks((c) => Chunk.of(Chunk.toReadonlyArray(c).map(result).join(""))))
    // The run's tool (its rules known once every result is written) comes after its results: keys have no order.
    const tail = Stream.suspend(() =>
      Stream.make(
        `],"tool":${JSON.stringify(Rules.sarifTool(tool, [...rules.keys()]))}${truncated ? `,"properties":${JSON.stringify({ truncatedAt: exportLimit })}` : ""}}]}`
      )
    )
    const head = `${JSON.stringify(Rules.sarifHead).slice(0, -1)},"runs":[{"results":[`
    return HttpServerResponse.stream(Stream.encodeText(Stream.concat(Stream.make(head), Stream.concat(results, tail))), { contentType: "application/sarif+json" })
  }
  const line = ([finding, i]: readonly [Findings.Finding, number]) => (i < exportLimit ? Rules.toJsonLines([finding]) : `${JSON.stringify({ truncatedAt: exportLimit })}\n`)
  const lines = found.pipe(Stream.mapChunks((c) => Chunk.of(Chunk.toReadonlyArray(c).map(line).join(""))))
  return HttpServerResponse.stream(Stream.encodeText(lines), { contentType: "application/x-ndjson" })
})

/** GET /v1/device/fleet-key: the key a device fingerprints secrets with (device token only). */
const fleetKey = Effect.gen(function* () {
  yield* Auth.device
  const settings = yield* Settings
  return ok(FindingIntake.fleetKey(settings) satisfies z.infer<typeof FindingsApi.FleetKey>)
})

const webhook = Effect.flatMap(Effect.serviceOption(Webhooks.Webhook), (o) =>
  Option.match(o, {
    onNone: () => Effect.fail(new ApiError({ status: 501, error: "webhook_unconfigured", message: "no webhook is configured (set webhookUrl and webhookSecret)" })),
    onSome: Effect.succeed
  })
)

/** GET /v1/admin/findings/webhook/dead-letters */
const deadLetters = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const w = yield* webhook
  return ok({ subscriber: Webhooks.subscriber, deadLetters: [...(yield* Effect.mapError(w.deadLetters, fromStoreError))] })
})

/** POST /v1/admin/findings/webhook/dead-letters/:seq/redeliver */
const redeliver = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const seq = yield* Request.idParam("seq")
  const w = yield* webhook
  if (!(yield* Effect.mapError(w.redeliver(seq), fromStoreError))) return yield* Effect.fail(new ApiError({ status: 404, error: "not_found", message: `no dead letter at outbox position ${seq}` }))
  return ok({ redelivering: seq }, 202)
})

/** The findings routes: admin reads and exports, and the device's fleet key. */
export const router: HttpRouter.HttpRouter<ApiError, Store.Store | Settings> = HttpRouter.empty.pipe(
  HttpRouter.get("/v1/admin/findings", list),
  HttpRouter.get("/v1/admin/findings/target", target),
  HttpRouter.get("/v1/admin/findings/:id/history", history),
  HttpRouter.get("/v1/admin/findings/export", exportRoute),
  HttpRouter.get("/v1/admin/findings/scans/:id", scan),
  HttpRouter.get("/v1/admin/findings/webhook/dead-letters", deadLetters),
  HttpRouter.post("/v1/admin/findings/webhook/dead-letters/:seq/redeliver", redeliver),
  HttpRouter.get("/v1/device/fleet-key", fleetKey)
)
