import { type Assignment, type Errors, Operations, Retry, Source, Store } from "@scanfleet/core"
import { Clock, Duration, Effect, Layer, Schedule } from "effect"
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

/** The sweeper fiber, every `intervalMs`, for the lifetime of the layer. A failed sweep is logged and retried on the next tick. */
export const layer = (intervalMs: number): Layer.Layer<never, never, Store.Store | Operations.Operations | Health.Health> =>
  Layer.scopedDiscard(
    Effect.forkScoped(
      sweepOnce.pipe(
        Effect.catchAllCause((cause) => Effect.logError("expiry sweep failed", cause)),
        Effect.repeat(Schedule.spaced(Duration.millis(intervalMs)))
      )
    )
  )
