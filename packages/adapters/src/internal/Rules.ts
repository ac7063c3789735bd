import { Either } from "effect"
import { type Assignment, Errors, PhaseModel, type Store } from "@scanfleet/core"

// The decisions every SQL adapter makes in the same order as core's reference
// model, so that the same request fails with the same reason on every backend.

type StoredEvent = PhaseModel.Event & { readonly acceptedAt: number }

/** A refusal of a worker write. */
export const refuse = (reason: Errors.ReservationRefused["reason"], reservationId: number, message: string) =>
  new Errors.ReservationRefused({ reason, reservationId, message })

/** Ownership and fence of a worker write, checked against the stored reservation. */
export const authorize = (
  auth: { readonly deviceId: number; readonly reservationId: number; readonly fence: number },
  a: Assignment.Assignment | undefined
): Either.Either<Assignment.Assignment, Errors.ReservationRefused> => {
  if (!a) return Either.left(refuse("not_found", auth.reservationId, `reservation ${auth.reservationId} does not exist`))
  if (a.deviceId !== auth.deviceId) return Either.left(refuse("not_owner", auth.reservationId, `reservation ${auth.reservationId} belongs to another device`))
  if (a.fence !== auth.fence) return Either.left(refuse("stale_fence", auth.reservationId, `fence ${auth.fence} was superseded by ${a.fence}`))
  return Either.right(a)
}

/** The reservation is active and its immutable assignment expiry has not passed. */
export const requireLive = (a: Assignment.Assignment, now: number): Either.Either<Assignment.Assignment, Errors.ReservationRefused> => {
  if (a.state !== "active")
    return Either.left(refuse(a.state === "expired" ? "expired" : "not_active", a.reservationId, `reservation ${a.reservationId} is ${a.state}`))
  if (now >= a.expiresAt) return Either.left(refuse("expired", a.reservationId, `reservation ${a.reservationId} passed its assignment expiry`))
  return Either.right(a)
}

/** The reservation no longer holds its target. */
export const lostTarget = (a: Assignment.Assignment, targetId: number) =>
  refuse("stale_fence", a.reservationId, `target ${targetId} is no longer held by fence ${a.fence}`)

const sameEvent = (a: PhaseModel.Event, b: PhaseModel.Event) =>
  a.seq === b.seq && a.kind === b.kind && a.phase === b.phase && a.at === b.at && (a.detail ?? null) === (b.detail ?? null)

/** What a progress batch will store, decided before anything is written. */
export interface ProgressPlan {
  readonly results: ReadonlyArray<Store.Acceptance>
  /** Events to insert, each stamped with its acceptance time. */
  readonly fresh: ReadonlyArray<StoredEvent>
  /** The assignment after the batch (unchanged when nothing is fresh). */
  readonly assignment: Assignment.Assignment
}

/**
 * Plans a progress batch against the stored timeline: duplicates return their
 * original acceptance, conflicting resubmissions and illegal events refuse the
 * whole batch, and fresh events need a live reservation.
 */
export const planProgress = (
  a: Assignment.Assignment,
  stored: ReadonlyArray<StoredEvent>,
  batch: ReadonlyArray<PhaseModel.Event>,
  now: number
): Either.Either<ProgressPlan, Errors.ReservationRefused | Errors.ProgressRejected> => {
  const bySeq = new Map<number, StoredEvent>(stored.map((e) => [e.seq, e]))
  let timeline: PhaseModel.Timeline = { events: [], phase: a.lastPhase, lastSeq: a.lastSeq }
  const results: Array<Store.Acceptance> = []
  const fresh: Array<StoredEvent> = []
  for (const e of batch) {
    if (e.seq <= timeline.lastSeq) {
      const prior = bySeq.get(e.seq)
      if (!prior || !sameEvent(prior, e))
        return Either.left(
          new Errors.ProgressRejected({ reason: "conflict", seq: e.seq, phase: e.phase, message: `sequence ${e.seq} was already accepted with different content` })
        )
      results.push({ seq: e.seq, status: "duplicate", acceptedAt: prior.acceptedAt })
      continue
    }
    if (fresh.length === 0) {
      const live = requireLive(a, now)
      if (Either.isLeft(live)) return Either.left(live.left)
    }
    const next = PhaseModel.append(timeline, e)
    if (Either.isLeft(next))
      return Either.left(new Errors.ProgressRejected({ reason: next.left.reason, seq: e.seq, phase: e.phase, message: next.left.message }))
    // Only the phase and the last sequence decide the next event: keeping the events
    // would copy the growing list at every step, quadratic in the batch.
    timeline = { events: [], phase: next.right.phase, lastSeq: next.right.lastSeq }
    // Built field by field: a spread with an added field is far slower in V8, per event.
    const accepted: StoredEvent =
      e.detail === undefined
        ? { seq: e.seq, kind: e.kind, phase: e.phase, at: e.at, acceptedAt: now }
        : { seq: e.seq, kind: e.kind, phase: e.phase, at: e.at, detail: e.detail, acceptedAt: now }
    fresh.push(accepted)
    bySeq.set(e.seq, accepted)
    results.push({ seq: e.seq, status: "accepted", acceptedAt: now })
  }
  if (fresh.length === 0) return Either.right({ results, fresh, assignment: a })
  return Either.right({ results, fresh, assignment: { ...a, lastPhase: timeline.phase, lastSeq: timeline.lastSeq, lastProgressAt: now } })
}
