import { HttpRouter, HttpServerRequest, HttpServerResponse } from "@effect/platform"
import { Records } from "@scanfleet/adapters"
import { AdminApi, type Errors, Operations, RemoteTimestamp, Source, Store, WorkerApi } from "@scanfleet/core"
import { Clock, Effect } from "effect"
import type { z } from "zod"
import { ApiError, fromNotFound, fromStoreError } from "./ApiError.js"
import * as Auth from "./Auth.js"
import * as Controls from "./Controls.js"
import * as Request from "./internal/Request.js"
import { Settings } from "./ServerConfig.js"
import * as Views from "./Views.js"

// Every assignment view names the fleet (database) that issued it.
const fleetId = Effect.flatMap(Store.Store, (s) => s.fleet()).pipe(
  Effect.map((f) => f.id),
  Effect.mapError(fromStoreError)
)

const ok = (body: unknown, status = 200) => HttpServerResponse.unsafeJson(body, { status })

/** A refusal of an operator action: 409 with its reason; nothing changed. */
export const fromOperationRefused = (e: Operations.OperationRefused) => new ApiError({ status: 409, error: `operation_refused:${e.reason}`, message: e.message })

const op = <A>(e: Effect.Effect<A, Errors.NotFound | Errors.StoreError | Operations.OperationRefused>) =>
  Effect.mapError(e, (err) => (err._tag === "NotFound" ? fromNotFound(err) : err._tag === "OperationRefused" ? fromOperationRefused(err) : fromStoreError(err)))

/** Who acts: the `x-scanfleet-actor` header (at most 200 characters), else "admin". */
export const actor = (why: string): Effect.Effect<Operations.Actor, ApiError, HttpServerRequest.HttpServerRequest> =>
  Effect.gen(function* () {
    const who = yield* Request.actorHeader
    return { who, why, now: yield* Clock.currentTimeMillis }
  })

/** A target as operators see it. */
export const targetView = (t: Operations.TargetDetail): z.infer<typeof AdminApi.TargetView> => ({
  id: t.id,
  source: t.source,
  identity: t.identity,
  status: t.status,
  observedRemoteAt: t.observedRemoteAt,
  coveredRemoteAt: t.coveredRemoteAt,
  completedAt: t.completedAt,
  lastScanStartedAt: t.lastScanStartedAt,
  fence: t.fence,
  attempts: t.attempts,
  discoveredAt: t.discoveredAt,
  priority: t.priority,
  changedAt: t.changedAt,
  redrive: { ...t.redrive }
})

/** A target and its assignments as operators see them. */
export const inspectionView = (i: Operations.Inspection, now: number, fleetId: string): z.infer<typeof AdminApi.Inspection> => ({
  target: targetView(i.target),
  assignments: i.assignments.map((a) => ({
    assignment: Views.assignment(a.assignment, now, fleetId),
    timeline: [...a.timeline],
    omittedEvents: a.omittedEvents,
    cancellation: a.cancellation ? { ...a.cancellation } : null
  }))
})

/** A device as operators see it. */
export const deviceView = (d: Operations.DeviceDetail, now: number, fleetId: string): z.infer<typeof AdminApi.DeviceDetailView> => ({
  ...Views.device(d),
  sources: d.sources === null ? null : [...d.sources],
  lastContactAt: d.lastContactAt,
  active: d.active.map((a) => Views.assignment(a, now, fleetId))
})

/**
 * Checks added targets as discovery checks its records: an identity the store can keep exactly
 * (`Records.identityProblem`), a remote timestamp valid by core's rule when one is given. Every
 * problem is named at its field path; nothing is stored when any is found.
 */
export const checkTargets = (input: z.infer<typeof AdminApi.AddTargets>, now: number) => {
  const issues: Array<{ path: Array<string | number>; message: string }> = []
  const observations = input.targets.map((t, i) => {
    const problem = Records.identityProblem(t.identity)
    if (problem) issues.push({ path: ["targets", i, "identity"], message: problem })
    let remoteAt: number | null = null
    if (t.remoteAt !== undefined && t.remoteAt !== null) {
      if (!Source.hasRemoteTimestamp(t.source)) issues.push({ path: ["targets", i, "remoteAt"], message: `${t.source} targets carry no remote timestamp` })
      else {
        const n = RemoteTimestamp.normalize(t.source, t.remoteAt, now)
        if (n === undefined) issues.push({ path: ["targets", i, "remoteAt"], message: "not a valid remote timestamp: an ISO-8601 instant with an offset, after 2000 and not in the future" })
        else remoteAt = n
      }
    }
    return { source: t.source, identity: t.identity, remoteAt }
  })
  return { observations, issues }
}

/** POST /v1/admin/targets: adds targets (one or a batch) as discovery would; audited. */
const addTargets = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const settings = yield* Settings
  const input = yield* Request.body(AdminApi.AddTargets, settings.maxBodyBytes)
  const who = yield* actor(input.reason)
  const { observations, issues } = checkTargets(input, who.now)
  if (issues.length > 0)
    return yield* new ApiError({
      status: 400,
      error: "invalid_body",
      message: `the request body is invalid: ${issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}; nothing was stored`,
      issues
    })
  const store = yield* Store.Store
  const ops = yield* Operations.Operations
  const r = yield* op(store.recordObservations(observations, who.now))
  yield* op(ops.audit("add_targets", observations.length === 1 ? Operations.targetSubject(observations[0].source, observations[0].identity) : `targets:${observations.length}`, { inserted: r.inserted.length, known: r.known }, who))
  return ok({ inserted: [...r.inserted], known: r.known } satisfies z.infer<typeof AdminApi.AddTargetsResult>, 201)
})

/** GET /v1/admin/targets/search: targets by source, status, identity prefix and change time, keyset paginated. */
const searchTargets = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const q = yield* Request.query(AdminApi.TargetSearchQuery)
  const ops = yield* Operations.Operations
  const page = yield* op(ops.listTargets({ source: q.source, status: q.status, identityPrefix: q.prefix, changedSince: q.changedSince, after: q.after, limit: q.limit }))
  return ok({ targets: page.targets.map(targetView), next: page.next } satisfies z.infer<typeof AdminApi.TargetPage>)
})

/** GET /v1/admin/targets/inspect?source=&identity=: one target, every lifecycle field, its newest assignments with their timelines (bounded: `Operations.apiTimeline`). */
const inspectTarget = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const q = yield* Request.query(AdminApi.TargetKeyQuery)
  const ops = yield* Operations.Operations
  const i = yield* op(ops.inspectTarget(q.source, q.identity, q.limit, Operations.apiTimeline))
  return ok(inspectionView(i, yield* Clock.currentTimeMillis, yield* fleetId))
})

/** POST /v1/admin/targets/requeue: a finished target back to pending with fresh budgets; audited. */
const requeue = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const settings = yield* Settings
  const input = yield* Request.body(AdminApi.Requeue, settings.maxBodyBytes)
  const ops = yield* Operations.Operations
  const t = yield* op(ops.requeue(input.source, input.identity, yield* actor(input.reason)))
  return ok(targetView(t))
})

/** POST /v1/admin/targets/priority: sets a target's claim priority in [-100, 100] (0 by default); audited with the previous value. */
const setPriority = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const settings = yield* Settings
  const input = yield* Request.body(AdminApi.SetPriority, settings.maxBodyBytes)
  const ops = yield* Operations.Operations
  const t = yield* op(ops.setPriority(input.source, input.identity, input.priority, yield* actor(input.reason)))
  yield* Effect.logInfo("target priority set").pipe(Effect.annotateLogs({ source: t.source, identity: t.identity, priority: t.priority }))
  return ok(targetView(t))
})

/** POST /v1/admin/assignments/:id/cancel: ends an active reservation, fenced; the device's next write is refused. */
const cancel = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const id = yield* Request.idParam("id")
  const settings = yield* Settings
  const input = yield* Request.body(AdminApi.WithReason, settings.maxBodyBytes)
  const ops = yield* Operations.Operations
  const a = yield* op(ops.cancel(id, yield* actor(input.reason)))
  yield* Effect.logInfo("assignment cancelled").pipe(Effect.annotateLogs({ reservationId: id, deviceId: a.deviceId }))
  return ok({ assignment: Views.assignment(a, yield* Clock.currentTimeMillis, yield* fleetId) })
})

const sourceParam = Request.pathParam("source", `one of ${Source.sources.join(", ")}`, (v) => {
  const r = Source.SourceSchema.safeParse(v)
  return r.success ? r.data : undefined
})

/** POST /v1/admin/sources/:source/pause and /resume: no claims and no discovery while paused; audited. */
const setPaused = (paused: boolean) =>
  Effect.gen(function* () {
    yield* Auth.admin({ cookie: false })
    const source = yield* sourceParam
    const settings = yield* Settings
    const input = yield* Request.body(AdminApi.WithReason, settings.maxBodyBytes)
    const ops = yield* Operations.Operations
    const c = yield* op(ops.setPaused(source, paused, yield* actor(input.reason)))
    yield* Effect.flatMap(Controls.Controls, (c) => c.invalidate)
    yield* Effect.logInfo(paused ? "source paused" : "source resumed").pipe(Effect.annotateLogs({ source }))
    return ok({ ...c })
  })

/** GET /v1/admin/sources: each source's controls. */
const sources = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  yield* Request.query(WorkerApi.EmptyQuery)
  const ops = yield* Operations.Operations
  return ok({ sources: (yield* op(ops.sourceControls())).map((c) => ({ ...c })) } satisfies z.infer<typeof AdminApi.SourceControls>)
})

/** GET /v1/admin/devices: every device with its claim filter, last contact and active reservations. */
const devices = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  yield* Request.query(WorkerApi.EmptyQuery)
  const ops = yield* Operations.Operations
  const now = yield* Clock.currentTimeMillis
  const fleet = yield* fleetId
  return ok({ devices: (yield* op(ops.listDevices())).map((d) => deviceView(d, now, fleet)) } satisfies z.infer<typeof AdminApi.DeviceList>)
})

/** POST /v1/admin/devices/:id/sources: the sources a device may claim (null: all); audited. */
const deviceSources = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const id = yield* Request.idParam("id")
  const settings = yield* Settings
  const input = yield* Request.body(AdminApi.DeviceSources, settings.maxBodyBytes)
  const ops = yield* Operations.Operations
  const d = yield* op(ops.setDeviceSources(id, input.sources, yield* actor(input.reason)))
  yield* Effect.flatMap(Controls.Controls, (c) => c.invalidate)
  return ok(deviceView(d, yield* Clock.currentTimeMillis, yield* fleetId))
})

/** DELETE /v1/admin/devices/:id?reason=: revokes a device and ends its active reservations at once, fenced; audited. */
const revokeDevice = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const id = yield* Request.idParam("id")
  const q = yield* Request.query(AdminApi.RevokeQuery)
  const ops = yield* Operations.Operations
  const ended = yield* op(ops.revokeDevice(id, yield* actor(q.reason ?? "revoked")))
  yield* Effect.logInfo("device revoked").pipe(Effect.annotateLogs({ deviceId: id, released: ended.length }))
  return ok({ revoked: id, released: ended.map((a) => a.reservationId) } satisfies z.infer<typeof AdminApi.Revoked>)
})

/** GET /v1/admin/audit?before=&limit=: the audit log, newest first. */
const audit = Effect.gen(function* () {
  yield* Auth.admin({ cookie: false })
  const q = yield* Request.query(AdminApi.AuditQuery)
  const ops = yield* Operations.Operations
  const entries = yield* op(ops.listAudit({ before: q.before, limit: q.limit }))
  return ok({ entries: entries.map((e) => ({ ...e, detail: JSON.parse(e.detail) as unknown })) } satisfies z.infer<typeof AdminApi.AuditList>)
})

/** The operator routes. */
export const router: HttpRouter.HttpRouter<ApiError, Store.Store | Operations.Operations | Controls.Controls | Settings> = HttpRouter.empty.pipe(
  HttpRouter.post("/v1/admin/targets", addTargets),
  HttpRouter.get("/v1/admin/targets/search", searchTargets),
  HttpRouter.get("/v1/admin/targets/inspect", inspectTarget),
  HttpRouter.post("/v1/admin/targets/requeue", requeue),
  HttpRouter.post("/v1/admin/targets/priority", setPriority),
  HttpRouter.post("/v1/admin/assignments/:id/cancel", cancel),
  HttpRouter.get("/v1/admin/sources", sources),
  HttpRouter.post("/v1/admin/sources/:source/pause", setPaused(true)),
  HttpRouter.post("/v1/admin/sources/:source/resume", setPaused(false)),
  HttpRouter.get("/v1/admin/devices", devices),
  HttpRouter.post("/v1/admin/devices/:id/sources", deviceSources),
  HttpRouter.del("/v1/admin/devices/:id", revokeDevice),
  HttpRouter.get("/v1/admin/audit", audit)
)
