import { HttpRouter, HttpServerRequest, HttpServerResponse } from "@effect/platform"
import { type Assignment, Config, type Errors, Operations, Percentile, Source, Store, WorkerApi } from "@scanfleet/core"
import { Clock, Effect, Either } from "effect"
import type { z } from "zod"
import { ApiError, fromNotFound, fromStoreError } from "./ApiError.js"
import * as Auth from "./Auth.js"
import * as Controls from "./Controls.js"
import * as Audited from "./internal/Audited.js"
import * as Managed from "./internal/Managed.js"
import * as Request from "./internal/Request.js"
import { Settings } from "./ServerConfig.js"
import * as Tokens from "./Tokens.js"
import * as Views from "./Views.js"

const ok = (body: unknown, status = 200) => HttpServerResponse.unsafeJson(body, { status })
const storeOp = <A, R>(e: Effect.Effect<A, Errors.NotFound | Errors.StoreError, R>) =>
  Effect.mapError(e, (err) => (err._tag === "NotFound" ? fromNotFound(err) : fromStoreError(err)))

/** Each source's effective policy under a document. */
export const effective = (doc: Config.ManagedConfig): Array<Config.EffectivePolicy> => Source.sources.map((s) => ({ ...Config.effectivePolicy(doc, s) }))

// Preview and apply validate identically; an invalid document is refused whole with every violation at its path.
const validated = Effect.gen(function* () {
  const settings = yield* Settings
  const candidate = yield* Request.json(settings.maxBodyBytes)
  const r = Config.preview(candidate)
  if (Either.isLeft(r)) {
    const issues = r.left.map((v) => ({ path: [...v.path], message: v.message }))
    return yield* Effect.fail(
      new ApiError({ status: 422, error: "invalid_config", message: `the configuration is invalid (${issues.length} violation${issues.length === 1 ? "" : "s"}); nothing was stored`, issues })
    )
  }
  return r.right
})

/** POST /v1/admin/config/preview: validates a candidate with core's rules; writes nothing. */
const preview = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const doc = yield* validated
  return ok({ valid: true, document: doc, effective: effective(doc) } satisfies z.infer<typeof WorkerApi.PreviewResponse>)
})

/** Longest `X-Scanfleet-Actor` header accepted, in characters. */
export const maxActorLength = Request.maxActorLength

/** POST /v1/admin/config/apply: stores a valid document as the next version. */
const apply = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const doc = yield* validated
  const by = yield* Request.actorHeader
  const now = yield* Clock.currentTimeMillis
  const v = yield* storeOp(Audited.applyConfig(doc, by, now))
  // This instance's next claim is issued under it; other instances' within Controls.cacheTtl.
  yield* Effect.flatMap(Controls.Controls, (c) => c.invalidate)
  yield* Effect.logInfo("configuration applied").pipe(Effect.annotateLogs({ version: v.version, appliedBy: by }))
  return ok(configView(v), 201)
})

const configView = (v: Store.ConfigVersion | null): z.infer<typeof WorkerApi.ConfigView> => {
  const document = v ? v.document : Config.defaults
  return {
    version: v ? v.version : null,
    origin: v ? "applied" : "defaults",
    appliedBy: v ? v.appliedBy : null,
    appliedAt: v ? v.appliedAt : null,
    document,
    effective: effective(document)
  }
}

/** GET /v1/admin/config: the configuration in force and each source's effective policy. */
const getConfig = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const { version } = yield* Managed.current
  return ok(configView(version))
})

/** POST /v1/admin/devices: registers a device; its token appears in this response only. */
const addDevice = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const settings = yield* Settings
  const req = yield* Request.body(WorkerApi.DeviceCreate, settings.maxBodyBytes)
  const by = yield* Request.actorHeader
  const now = yield* Clock.currentTimeMillis
  const token = Tokens.generate()
  const d = yield* storeOp(Audited.addDevice({ name: req.name, slots: req.slots, tokenHash: Tokens.hash(token) }, by, now))
  yield* Effect.logInfo("device registered").pipe(Effect.annotateLogs({ deviceId: d.id, name: d.name, slots: d.slots }))
  return ok({ device: Views.device(d), token }, 201)
})

/** GET /v1/admin/assignments?state=&limit=: assignment views, newest first. */
const listAssignments = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const q = yield* Request.query(WorkerApi.AssignmentListQuery)
  const store = yield* Store.Store
  const rows = yield* storeOp(store.listAssignments({ state: q.state, limit: q.limit }))
  const now = yield* Clock.currentTimeMillis
  const fleet = yield* storeOp(store.fleet())
  return ok({ assignments: rows.map((a) => Views.assignment(a, now, fleet.id)) })
})

/** GET /v1/admin/assignments/:id: one assignment and its accepted timeline. */
const getAssignment = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const id = yield* Request.idParam("id")
  const store = yield* Store.Store
  const a = yield* storeOp(store.getAssignment(id))
  const timeline = yield* storeOp(store.timeline(id))
  const now = yield* Clock.currentTimeMillis
  const fleet = yield* storeOp(store.fleet())
  return ok({ assignment: Views.assignment(a, now, fleet.id), timeline })
})

/** GET /v1/admin/cycles?source=&limit=: discovery cycle records, newest first. */
const listCycles = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const q = yield* Request.query(WorkerApi.CycleListQuery)
  const store = yield* Store.Store
  const cycles = yield* storeOp(store.listCycles({ source: q.source, limit: q.limit }))
  return ok({ cycles })
})

/** GET /v1/admin/targets: target counts by source and status. */
const targets = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  yield* Request.query(WorkerApi.EmptyQuery)
  const store = yield* Store.Store
  return ok(yield* storeOp(store.countTargets()))
})

/**
 * The percentile answer. Within each source and outcome that has data, every
 * metric is listed, so a metric with no completed observation shows as
 * insufficient with a count of 0 rather than disappearing.
 */
export const percentileData = (q: z.infer<typeof WorkerApi.PercentileQuery>): Effect.Effect<z.infer<typeof WorkerApi.PercentileResponse>, ApiError, Store.Store> =>
  Effect.gen(function* () {
    const store = yield* Store.Store
    const { document } = yield* Managed.current
    const to = yield* Clock.currentTimeMillis
    const from = to - Math.round(q.windowHours * 3_600_000)
    const minSamples = document.metrics.minSamples
    // The last windowHours exactly: durations that ended after `from`, up to `to` included (the store reads [from + 1, to + 1)).
    const rows = yield* storeOp(store.percentiles({ from: from + 1, to: to + 1, source: q.source, metric: q.metric, outcome: q.outcome, minSamples }))
    const filled = [...rows]
    if (q.metric === undefined) {
      const groups = new Set(rows.map((r) => `${r.source}\u0000${r.outcome}`))
      for (const g of groups) {
        const [source, outcome] = g.split("\u0000") as [Source.Source, (typeof rows)[number]["outcome"]]
        for (const metric of Percentile.metrics)
          if (!rows.some((r) => r.source === source && r.outcome === outcome && r.metric === metric))
            filled.push({ source, outcome, metric, ...Percentile.summarize([], minSamples) })
      }
    }
    filled.sort(
      (a, b) =>
        a.source.localeCompare(b.source) || a.outcome.localeCompare(b.outcome) || Percentile.metrics.indexOf(a.metric) - Percentile.metrics.indexOf(b.metric)
    )
    return { from, to, windowHours: q.windowHours, minSamples, rows: filled } satisfies z.infer<typeof WorkerApi.PercentileResponse>
  })

/** GET /v1/admin/percentiles?source&metric&outcome&windowHours: p50/p95/p99 with sample counts and insufficient labels. */
const percentiles = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const q = yield* Request.query(WorkerApi.PercentileQuery)
  return ok(yield* percentileData(q))
})

/** The dashboard's headline numbers. */
export const summaryData: Effect.Effect<z.infer<typeof WorkerApi.SummaryView>, ApiError, Store.Store> = Effect.gen(function* () {
  const store = yield* Store.Store
  const counts = yield* storeOp(store.countTargets())
  const totals = yield* storeOp(store.cycleTotals())
  const assignments = yield* storeOp(store.countAssignments())
  const byStatus = (s: string) => counts.filter((c) => c.status === s).reduce((n, c) => n + c.count, 0)
  const inState = (p: (c: Store.AssignmentCount) => boolean) => assignments.filter(p).reduce((n, c) => n + c.count, 0)
  const now = yield* Clock.currentTimeMillis
  return {
    targets: {
      queuedNew: totals.reduce((n, t) => n + t.queuedNewCount, 0),
      queuedUpdated: totals.reduce((n, t) => n + t.queuedUpdatedCount, 0),
      pending: byStatus("pending"),
      inProgress: byStatus("in_progress"),
      completed: byStatus("completed"),
      failed: byStatus("failed")
    },
    assignments: {
      running: inState((c) => c.state === "active"),
      completed: inState((c) => Operations.bucketOf(c.state, c.outcome) === "completed"),
      // One outcome is counted once (core's bucket): a timed-out assignment is in timedOut, not also in failed.
      timedOut: inState((c) => Operations.bucketOf(c.state, c.outcome) === "timedOut"),
      failed: inState((c) => Operations.bucketOf(c.state, c.outcome) === "failed"),
      expired: inState((c) => Operations.bucketOf(c.state, c.outcome) === "expired"),
      released: inState((c) => Operations.bucketOf(c.state, c.outcome) === "released")
    },
    serverNow: now
  } satisfies z.infer<typeof WorkerApi.SummaryView>
})

/** GET /v1/admin/summary: targets queued new and updated, assignments running, completed, timed out, failed otherwise, expired. */
const summary = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  yield* Request.query(WorkerApi.EmptyQuery)
  return ok(yield* summaryData)
})

/** The admin API routes. */
export const router: HttpRouter.HttpRouter<ApiError, Store.Store | Operations.Operations | Controls.Controls | Settings> = HttpRouter.empty.pipe(
  HttpRouter.post("/v1/admin/config/preview", preview),
  HttpRouter.post("/v1/admin/config/apply", apply),
  HttpRouter.get("/v1/admin/config", getConfig),
  HttpRouter.post("/v1/admin/devices", addDevice),
  HttpRouter.get("/v1/admin/assignments", listAssignments),
  HttpRouter.get("/v1/admin/assignments/:id", getAssignment),
  HttpRouter.get("/v1/admin/cycles", listCycles),
  HttpRouter.get("/v1/admin/targets", targets),
  HttpRouter.get("/v1/admin/percentiles", percentiles),
  HttpRouter.get("/v1/admin/summary", summary)
)
