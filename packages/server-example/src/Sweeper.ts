import { type Assignment, type Errors, Operations, Retry, Source, Store } from "@scanfleet/core"
import { Cause, Clock, Duration, Effect, Layer, Schedule } from "effect"
import type { ApiError } from "./ApiError.js"
import * as Health from "./Health.js"
import * as Managed from "./internal/Managed.js"

/** Reservations expired per sweep at most; the next sweep takes the rest. */
export const batchLimit = 500

/**
 * One sweep: every active reservation past its immutable assignment expiry
 * becomes expired, keeping the last accepted phase and last progress time as
 * evidence; its target goes back to pending, or to failed after
 * `expiry.maxAttempts` claims at its revision. Then each source's failed and unresolved
 * targets due by its failure backoff (or seen at a newer revision) are redriven to pending.
 */
export const sweepOnce: Effect.Effect<ReadonlyArray<Assignment.Assignment>, ApiError | Errors.StoreError, Store.Store | Operations.Operations | Health.Health> = Effect.gen(function* () {
  const store = yield* Store.Store
  const { document } = yield* Managed.current
  const now = yield* Clock.currentTimeMillis
  const expired = yield* store.expireDue({ now, maxAttempts: document.expiry.maxAttempts, limit: batchLimit })
  for (const a of expired)
    yield* Effect.logWarning("assignment expired").pipe(
      Effect.annotateLogs({
        reservationId: a.reservationId,
        deviceId: a.deviceId,
        source: a.source,
        identity: a.identity,
        assignmentExpiry: new Date(a.expiresAt).toISOString(),
        lastPhase: a.expiry?.lastPhase ?? null,
        lastProgressAt: a.expiry?.lastProgressAt ? new Date(a.expiry.lastProgressAt).toISOString() : null
      })
    )
  const ops = yield* Operations.Operations
  for (const source of Source.sources) {
    const r = yield* ops.redriveDue(source, Retry.backoffOf(document, source), now, batchLimit)
    if (r.redriven.length > 0)
      yield* Effect.logInfo("failed targets redriven").pipe(
        Effect.annotateLogs({ source, count: r.redriven.length, newerRevision: r.redriven.filter((x) => x.reason === "newer_revision").length })
      )
  }
  yield* Health.markSwept(now)
  return expired
})

/** How often a run of failed sweeps is logged again while it lasts. */
export const failureLogEvery = Duration.minutes(1)

/**
 * The sweeper fiber, every `intervalMs`, for the lifetime of the layer. A failed sweep is retried on
 * the next tick. The first failure of a run is logged as an error (a store's or the API's failure by
 * its message, anything else with its cause), then once a `failureLogEvery` with the count so far,
 * and the first sweep that succeeds again says how many failed: an outage of the database is a few
 * lines, not one with a stack trace every tick.
 */
export const layer = (intervalMs: number): Layer.Layer<never, never, Store.Store | Operations.Operations | Health.Health> =>
  Layer.scopedDiscard(
    Effect.gen(function* () {
      let failures = 0
      let loggedAt = 0
      const failed = (cause: Cause.Cause<ApiError | Errors.StoreError>) =>
        Effect.gen(function* () {
          const now = yield* Clock.currentTimeMillis
          failures++
          if (failures > 1 && now - loggedAt < Duration.toMillis(failureLogEvery)) return
          loggedAt = now
          const known = Cause.failureOption(cause)
          const log = failures === 1 ? Effect.logError : Effect.logWarning
          yield* (known._tag === "Some" ? log("expiry sweep failed") : log("expiry sweep failed", cause)).pipe(
            Effect.annotateLogs({ ...(known._tag === "Some" ? { error: known.value.message } : {}), failedSweeps: failures })
          )
        })
      const recovered = Effect.suspend(() => {
        if (failures === 0) return Effect.void
        const n = failures
        failures = 0
        return Effect.logInfo("expiry sweep recovered").pipe(Effect.annotateLogs({ failedSweeps: n }))
      })
      yield* Effect.forkScoped(
        sweepOnce.pipe(Effect.zipRight(recovered), Effect.catchAllCause(failed), Effect.zipRight(Health.markTried), Effect.repeat(Schedule.spaced(Duration.millis(intervalMs))))
      )
    })
  )
