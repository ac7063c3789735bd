import { HttpRouter, HttpServerResponse } from "@effect/platform"
import { Store, WorkerApi } from "@scanfleet/core"
import { Clock, Effect } from "effect"
import {
  ApiError,
  fromClaimRejected,
  fromNotFound,
  fromProgressRejected,
  fromReservationRefused,
  fromStoreError
} from "./ApiError.js"
import * as Auth from "./Auth.js"
import * as FindingIntake from "./FindingIntake.js"
import * as Managed from "./internal/Managed.js"
import * as Request from "./internal/Request.js"
import { Settings } from "./ServerConfig.js"
import * as Views from "./Views.js"

const ok = (body: unknown, status = 200) => HttpServerResponse.unsafeJson(body, { status })

// The reservation must exist (404) and belong to the caller (403) before any write is tried.
const owned = (reservationId: number, deviceId: number) =>
  Effect.gen(function* () {
    const store = yield* Store.Store
    const a = yield* store.getAssignment(reservationId).pipe(
      Effect.catchTags({ NotFound: (e) => Effect.fail(fromNotFound(e)), StoreError: (e) => Effect.fail(fromStoreError(e)) })
    )
    if (a.deviceId !== deviceId)
      return yield* Effect.fail(
        new ApiError({ status: 403, error: "reservation_refused:not_owner", message: `reservation ${reservationId} belongs to another device` })
      )
    return a
  })

/** POST /v1/assignments/claim: one assignment for one slot, or `{ assignment: null }` when nothing is pending. */
const claim = Effect.gen(function* () {
  const device = yield* Auth.device
  const settings = yield* Settings
  const req = yield* Request.body(WorkerApi.ClaimRequest, settings.maxBodyBytes)
  if (req.slot >= device.slots)
    return yield* Effect.fail(
      new ApiError({ status: 400, error: "invalid_body", message: `slot must be below the device's ${device.slots} slots`, issues: [{ path: ["slot"], message: `must be between 0 and ${device.slots - 1}` }] })
    )
  const store = yield* Store.Store
  const { document } = yield* Managed.current
  const now = yield* Clock.currentTimeMillis
  const a = yield* store
    .claim({ deviceId: device.id, slot: req.slot, now, config: document })
    .pipe(Effect.catchTags({ ClaimRejected: (e) => Effect.fail(fromClaimRejected(e)), StoreError: (e) => Effect.fail(fromStoreError(e)) }))
  if (a) yield* Effect.logInfo("assignment issued").pipe(Effect.annotateLogs({ reservationId: a.reservationId, deviceId: device.id, slot: a.slot, source: a.source, policyOrigin: a.policy.origin, expiresAt: a.expiresAt }))
  return ok({ assignment: a ? Views.assignment(a, now) : null })
})

/** POST /v1/assignments/:id/progress: a batch of events, accepted idempotently; renews nothing. */
const progress = Effect.gen(function* () {
  const device = yield* Auth.device
  const id = yield* Request.idParam("id")
  const settings = yield* Settings
  const req = yield* Request.body(WorkerApi.ProgressRequest, settings.maxBodyBytes)
  yield* owned(id, device.id)
  const store = yield* Store.Store
  const now = yield* Clock.currentTimeMillis
  const r = yield* store.appendProgress({ deviceId: device.id, reservationId: id, fence: req.fence, now }, req.events).pipe(
    Effect.catchTags({
      ReservationRefused: (e) => Effect.fail(fromReservationRefused(e)),
      ProgressRejected: (e) => Effect.fail(fromProgressRejected(e, Math.max(0, req.events.findIndex((x) => x.seq === e.seq)))),
      StoreError: (e) => Effect.fail(fromStoreError(e))
    })
  )
  yield* Effect.logDebug("progress").pipe(
    Effect.annotateLogs({ reservationId: id, accepted: r.results.filter((x) => x.status === "accepted").length, duplicate: r.results.filter((x) => x.status === "duplicate").length, phase: r.assignment.lastPhase })
  )
  return ok({ results: r.results, latestPhase: r.assignment.lastPhase, lastSeq: r.assignment.lastSeq, assignmentExpiry: r.assignment.expiresAt })
})

/** POST /v1/assignments/:id/result: the result, under the result-upload deadline; answers with the receipt. */
const result = Effect.gen(function* () {
  const device = yield* Auth.device
  const id = yield* Request.idParam("id")
  const req = yield* Request.body(WorkerApi.ResultRequest, WorkerApi.maxResultBytes)
  const a = yield* owned(id, device.id)
  // Findings are checked for what will be stored: a result the store refuses or answers with its first
  // receipt (another fence, an ended reservation) stores no body, and its authority is judged first.
  const findings = a.state === "active" && a.fence === req.fence ? yield* FindingIntake.accept(req.findings, yield* Settings) : []
  const store = yield* Store.Store
  const now = yield* Clock.currentTimeMillis
  const receipt = yield* store
    .submitResult({ deviceId: device.id, reservationId: id, fence: req.fence, now, outcome: req.outcome, finalPhase: req.finalPhase, body: JSON.stringify({ findings, log: req.log }) })
    .pipe(Effect.catchTags({ ReservationRefused: (e) => Effect.fail(fromReservationRefused(e)), StoreError: (e) => Effect.fail(fromStoreError(e)) }))
  yield* Effect.logInfo("result accepted").pipe(Effect.annotateLogs({ reservationId: id, deviceId: device.id, outcome: receipt.outcome, finalPhase: req.finalPhase, findings: req.findings.length }))
  return ok(receipt)
})

/** POST /v1/assignments/:id/release: gives an active reservation back; the target returns to pending. */
const release = Effect.gen(function* () {
  const device = yield* Auth.device
  const id = yield* Request.idParam("id")
  const settings = yield* Settings
  const req = yield* Request.body(WorkerApi.ReleaseRequest, settings.maxBodyBytes)
  yield* owned(id, device.id)
  const store = yield* Store.Store
  const now = yield* Clock.currentTimeMillis
  const a = yield* store
    .release({ deviceId: device.id, reservationId: id, fence: req.fence, now })
    .pipe(Effect.catchTags({ ReservationRefused: (e) => Effect.fail(fromReservationRefused(e)), StoreError: (e) => Effect.fail(fromStoreError(e)) }))
  return ok(Views.assignment(a, now))
})

/** GET /v1/assignments/:id: the caller's own assignment. */
const get = Effect.gen(function* () {
  const device = yield* Auth.device
  const id = yield* Request.idParam("id")
  const a = yield* owned(id, device.id)
  const now = yield* Clock.currentTimeMillis
  return ok(Views.assignment(a, now))
})

/** The Worker API routes. */
export const router: HttpRouter.HttpRouter<ApiError, Store.Store | Settings> = HttpRouter.empty.pipe(
  HttpRouter.post("/v1/assignments/claim", claim),
  HttpRouter.post("/v1/assignments/:id/progress", progress),
  HttpRouter.post("/v1/assignments/:id/result", result),
  HttpRouter.post("/v1/assignments/:id/release", release),
  HttpRouter.get("/v1/assignments/:id", get)
)
