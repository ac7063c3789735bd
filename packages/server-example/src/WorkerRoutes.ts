import { HttpRouter, HttpServerResponse } from "@effect/platform"
import { Claim, type Errors, Operations, Store, WorkerApi } from "@scanfleet/core"
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
import * as Controls from "./Controls.js"
import * as FindingIntake from "./FindingIntake.js"
import * as Request from "./internal/Request.js"
import { Settings } from "./ServerConfig.js"
import * as Views from "./Views.js"

const ok = (body: unknown, status = 200) => HttpServerResponse.unsafeJson(body, { status })

// A reservation an operator cancelled is refused as `reservation_refused:cancelled`, with who and why,
// so the device knows to kill the unit rather than retry.
const refused = (e: Errors.ReservationRefused) =>
  e.reason !== "not_active"
    ? Effect.fail(fromReservationRefused(e))
    : Effect.flatMap(Effect.flatMap(Operations.Operations, (ops) => Effect.orElseSucceed(ops.cancellation(e.reservationId), () => null)), (c) =>
        Effect.fail(
          c === null
            ? fromReservationRefused(e)
            : new ApiError({
                status: 403,
                error: "reservation_refused:cancelled",
                message: `reservation ${e.reservationId} was cancelled by ${c.who} at ${new Date(c.at).toISOString()}: ${c.why}; stop its scan`
              })
        )
      )

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
  const received = yield* Clock.currentTimeMillis
  const device = yield* Auth.device
  const settings = yield* Settings
  const req = yield* Request.body(WorkerApi.ClaimRequest, settings.maxBodyBytes)
  // The client's patience, from when the request reached this handler: a claim that
  // would commit later is refused, so no slot is held for a client that gave up.
  const notAfter = req.waitMs === undefined ? undefined : received + req.waitMs
  if (req.slot >= device.slots)
    return yield* Effect.fail(
      new ApiError({ status: 400, error: "invalid_body", message: `slot must be below the device's ${device.slots} slots`, issues: [{ path: ["slot"], message: `must be between 0 and ${device.slots - 1}` }] })
    )
  const store = yield* Store.Store
  const controls = yield* Controls.Controls
  const { document } = yield* controls.inForce
  const now = yield* Clock.currentTimeMillis
  if (notAfter !== undefined && now > notAfter) return yield* Effect.fail(fromClaimRejected(Claim.deadlinePassed(notAfter)))
  const sources = yield* controls.claimable(device.id, undefined)
  const a = yield* store
    .claim({ deviceId: device.id, slot: req.slot, now, config: document, ...(sources === undefined ? {} : { sources }), ...(notAfter === undefined ? {} : { notAfter }) })
    .pipe(Effect.catchTags({ ClaimRejected: (e) => Effect.fail(fromClaimRejected(e)), StoreError: (e) => Effect.fail(fromStoreError(e)) }))
  const fleet = yield* store.fleet().pipe(Effect.mapError(fromStoreError))
  if (a) yield* Effect.logInfo("assignment issued").pipe(Effect.annotateLogs({ reservationId: a.reservationId, deviceId: device.id, slot: a.slot, source: a.source, policyOrigin: a.policy.origin, expiresAt: a.expiresAt }))
  return ok({ assignment: a ? Views.assignment(a, now, fleet.id) : null })
})

/** POST /v1/assignments/:id/progress: a batch of events, accepted idempotently; renews nothing. */
const progress = Effect.gen(function* () {
  const device = yield* Auth.device
  const id = yield* Request.idParam("id")
  const settings = yield* Settings
  // Whose reservation it is, before a byte of the body is read: a device uploads only to its own.
  yield* owned(id, device.id)
  const req = yield* Request.body(WorkerApi.ProgressRequest, settings.maxBodyBytes)
  const store = yield* Store.Store
  const now = yield* Clock.currentTimeMillis
  const r = yield* store.appendProgress({ deviceId: device.id, reservationId: id, fence: req.fence, now }, req.events).pipe(
    Effect.catchTags({
      ReservationRefused: refused,
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
  const a = yield* owned(id, device.id)
  const req = yield* Request.body(WorkerApi.ResultRequest, WorkerApi.maxResultBytes)
  // Findings are checked for what will be stored: a result the store refuses or answers with its first
  // receipt (another fence, an ended reservation) stores no body, and its authority is judged first.
  const findings = a.state === "active" && a.fence === req.fence ? yield* FindingIntake.accept(req.findings, yield* Settings) : []
  const store = yield* Store.Store
  const now = yield* Clock.currentTimeMillis
  const receipt = yield* store
    .submitResult({ deviceId: device.id, reservationId: id, fence: req.fence, now, outcome: req.outcome, finalPhase: req.finalPhase, body: JSON.stringify({ findings, log: req.log }) })
    .pipe(Effect.catchTags({ ReservationRefused: refused, StoreError: (e) => Effect.fail(fromStoreError(e)) }))
  yield* Effect.logInfo("result accepted").pipe(Effect.annotateLogs({ reservationId: id, deviceId: device.id, outcome: receipt.outcome, finalPhase: req.finalPhase, findings: req.findings.length }))
  return ok(receipt)
})

/** POST /v1/assignments/:id/release: gives an active reservation back; the target returns to pending. */
const release = Effect.gen(function* () {
  const device = yield* Auth.device
  const id = yield* Request.idParam("id")
  const settings = yield* Settings
  yield* owned(id, device.id)
  const req = yield* Request.body(WorkerApi.ReleaseRequest, settings.maxBodyBytes)
  const store = yield* Store.Store
  const now = yield* Clock.currentTimeMillis
  const a = yield* store
    .release({ deviceId: device.id, reservationId: id, fence: req.fence, now })
    .pipe(Effect.catchTags({ ReservationRefused: refused, StoreError: (e) => Effect.fail(fromStoreError(e)) }))
  const fleet = yield* store.fleet().pipe(Effect.mapError(fromStoreError))
  return ok(Views.assignment(a, now, fleet.id))
})

/** GET /v1/assignments/:id: the caller's own assignment. */
const get = Effect.gen(function* () {
  const device = yield* Auth.device
  const id = yield* Request.idParam("id")
  const a = yield* owned(id, device.id)
  const now = yield* Clock.currentTimeMillis
  const fleet = yield* Effect.flatMap(Store.Store, (store) => store.fleet()).pipe(Effect.mapError(fromStoreError))
  return ok(Views.assignment(a, now, fleet.id))
})

/**
 * POST /v1/device/register: a starting worker reports the containment in force on
 * its machine; the answer names the fleet, so the worker knows whose journal entries
 * this server may receive.
 */
const register = Effect.gen(function* () {
  const device = yield* Auth.device
  const settings = yield* Settings
  const req = yield* Request.body(WorkerApi.RegisterRequest, settings.maxBodyBytes)
  const store = yield* Store.Store
  const now = yield* Clock.currentTimeMillis
  const d = yield* store
    .reportDevice(device.id, { containment: req.containment, now })
    .pipe(Effect.catchTags({ NotFound: (e) => Effect.fail(fromNotFound(e)), StoreError: (e) => Effect.fail(fromStoreError(e)) }))
  const fleet = yield* store.fleet().pipe(Effect.mapError(fromStoreError))
  yield* Effect.logInfo("device registered").pipe(Effect.annotateLogs({ deviceId: d.id, containment: req.containment }))
  return ok({ fleetId: fleet.id, device: Views.device(d), serverNow: now })
})

/** The Worker API routes. */
export const router: HttpRouter.HttpRouter<ApiError, Store.Store | Operations.Operations | Controls.Controls | Settings> = HttpRouter.empty.pipe(
  HttpRouter.post("/v1/device/register", register),
  HttpRouter.post("/v1/assignments/claim", claim),
  HttpRouter.post("/v1/assignments/:id/progress", progress),
  HttpRouter.post("/v1/assignments/:id/result", result),
  HttpRouter.post("/v1/assignments/:id/release", release),
  HttpRouter.get("/v1/assignments/:id", get)
)
