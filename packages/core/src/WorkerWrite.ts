import { Either } from "effect"
import * as Assignment from "./Assignment.js"
import * as Claim from "./Claim.js"
import { ProgressRejected, ReservationRefused } from "./Errors.js"
import * as PhaseModel from "./PhaseModel.js"
import type { Acceptance, Authority } from "./Store.js"
import type { Target } from "./Target.js"

// The decisions on a worker's writes (progress, result, release), in the one order
// every Store applies them, so that the same request fails with the same reason on
// every backend. Stores only read what these functions need and write what they decide.

/** A progress event as stored: with the server time it was first accepted. */
export type StoredEvent = PhaseModel.Event & { readonly acceptedAt: number }

/** A refusal of a worker write. */
export const refuse = (reason: ReservationRefused["reason"], reservationId: number, message: string): ReservationRefused =>
  new ReservationRefused({ reason, reservationId, message })

/** Ownership and fence of a worker write, checked against the stored reservation (`undefined`: none). */
export const authorize = (
  auth: Pick<Authority, "deviceId" | "reservationId" | "fence">,
  a: Assignment.Assignment | undefined
): Either.Either<Assignment.Assignment, ReservationRefused> => {
  if (!a) return Either.left(refuse("not_found", auth.reservationId, `reservation ${auth.reservationId} does not exist`))
  if (a.deviceId !== auth.deviceId) return Either.left(refuse("not_owner", auth.reservationId, `reservation ${auth.reservationId} belongs to another device`))
  if (a.fence !== auth.fence) return Either.left(refuse("stale_fence", auth.reservationId, `fence ${auth.fence} was superseded by ${a.fence}`))
  return Either.right(a)
}

/** The reservation is active and its immutable assignment expiry has not passed. */
export const requireLive = (a: Assignment.Assignment, now: number): Either.Either<Assignment.Assignment, ReservationRefused> => {
  if (a.state !== "active")
    return Either.left(refuse(a.state === "expired" ? "expired" : "not_active", a.reservationId, `reservation ${a.reservationId} is ${a.state}`))
  if (now >= a.expiresAt) return Either.left(refuse("expired", a.reservationId, `reservation ${a.reservationId} passed its assignment expiry`))
  return Either.right(a)
}

/** The refusal of a write whose reservation no longer holds its target. */
export const lostTarget = (a: Assignment.Assignment, targetId: number): ReservationRefused =>
  refuse("stale_fence", a.reservationId, `target ${targetId} is no longer held by fence ${a.fence}`)

/** The receipt id of the result of one reservation under one fence: the only place it is spelled. */
export const receiptId = (reservationId: number, fence: number): string => `rc-${reservationId}-${fence}`

/** The receipt of a result accepted for a reservation under `fence` at `acceptedAt`. */
export const receiptOf = (a: Pick<Assignment.Assignment, "reservationId" | "fence">, outcome: Assignment.Outcome, acceptedAt: number): Assignment.Receipt => ({
  receiptId: receiptId(a.reservationId, a.fence),
  reservationId: a.reservationId,
  outcome,
  acceptedAt
})

/**
 * The receipt of an ended reservation, read back from its own row: a reservation ends
 * `completed` or `failed` only by an accepted result, at `endedAt`, with its outcome.
 * Null for any other reservation.
 */
export const priorReceipt = (a: Assignment.Assignment): Assignment.Receipt | null =>
  (a.state === "completed" || a.state === "failed") && a.outcome !== null && a.endedAt !== null ? receiptOf(a, a.outcome, a.endedAt) : null

/** What accepting a result writes: the target's and the reservation's end, and the receipt. */
export interface ResultPlan {
  readonly receipt: Assignment.Receipt
  readonly targetStatus: "completed" | "failed" | "unresolved"
  readonly state: "completed" | "failed"
}

/** The writes of a result for an authorized, live reservation whose target it holds. */
export const resultPlan = (a: Pick<Assignment.Assignment, "reservationId" | "fence">, outcome: Assignment.Outcome, now: number): ResultPlan => {
  const targetStatus = Assignment.targetStatusAfter(outcome)
  return { receipt: receiptOf(a, outcome, now), targetStatus, state: targetStatus === "completed" ? "completed" : "failed" }
}

/** A result accepted now (with its writes), or a repeat of one accepted before (with its receipt). */
export type ResultJudgement = { readonly _tag: "repeat"; readonly receipt: Assignment.Receipt } | ({ readonly _tag: "accept" } & ResultPlan)

/**
 * Judges a result upload: ownership and fence, then a repeat of an accepted result
 * (its original receipt, `Left` of nothing), then a live reservation, the result-upload
 * deadline and the fenced hold on the target. `Right` with a plan when it is accepted,
 * `Right` with the prior receipt when it repeats one.
 */
const repeats = new WeakSet<Assignment.Receipt>()

/**
 * True when `receipt` answered a resubmission (the original receipt again) rather than a
 * result the call accepted. Every store answers a repeat with the receipt `judgeResult`
 * made for it, and this knows that object; the receipt itself stays exactly the original,
 * field for field (a repeat and its first acceptance can share a millisecond, so their
 * times cannot tell them apart).
 */
export const isRepeat = (receipt: Assignment.Receipt): boolean => repeats.has(receipt)

export const judgeResult = (
  input: Pick<Authority, "deviceId" | "reservationId" | "fence" | "now"> & { readonly outcome: Assignment.Outcome },
  a: Assignment.Assignment | undefined,
  target: (a: Assignment.Assignment) => Target
): Either.Either<ResultJudgement, ReservationRefused> =>
  Either.flatMap(authorize(input, a), (a): Either.Either<ResultJudgement, ReservationRefused> => {
    const prior = priorReceipt(a)
    if (prior !== null) {
      repeats.add(prior)
      return Either.right({ _tag: "repeat" as const, receipt: prior })
    }
    return Either.flatMap(requireLive(a, input.now), (a): Either.Either<ResultJudgement, ReservationRefused> => {
      if (input.now > a.uploadDeadline)
        return Either.left(refuse("upload_deadline_passed", a.reservationId, `the result-upload deadline passed at ${new Date(a.uploadDeadline).toISOString()}`))
      const t = target(a)
      if (!Claim.holds(t, a.fence)) return Either.left(lostTarget(a, t.id))
      return Either.right({ _tag: "accept" as const, ...resultPlan(a, input.outcome, input.now) })
    })
  })

/** Judges a release: ownership and fence, a live reservation, the fenced hold on the target. */
export const judgeRelease = (
  auth: Authority,
  a: Assignment.Assignment | undefined,
  target: (a: Assignment.Assignment) => Target
): Either.Either<Assignment.Assignment, ReservationRefused> =>
  Either.flatMap(
    Either.flatMap(authorize(auth, a), (a) => requireLive(a, auth.now)),
    (a) => {
      const t = target(a)
      return Claim.holds(t, a.fence) ? Either.right({ ...a, state: "released", endedAt: auth.now } satisfies Assignment.Assignment) : Either.left(lostTarget(a, t.id))
    }
  )

/**
 * The durations an ended reservation contributes, from its stored timeline (in sequence
 * order): `Assignment.durationsOf` with the upload measured from the server's acceptance
 * of the first `uploading` event.
 */
export const durationsOfEnded = (
  a: Pick<Assignment.Assignment, "source" | "issuedAt">,
  timeline: ReadonlyArray<StoredEvent>,
  outcome: Assignment.Outcome,
  endedAt: number
): ReadonlyArray<Assignment.Duration> => {
  const uploading = timeline.find((e) => e.kind === "phase" && e.phase === "uploading")
  return Assignment.durationsOf(a, timeline, outcome, endedAt, uploading ? uploading.acceptedAt : null)
}

const sameEvent = (a: PhaseModel.Event, b: PhaseModel.Event) =>
  a.seq === b.seq && a.kind === b.kind && a.phase === b.phase && a.at === b.at && (a.detail ?? null) === (b.detail ?? null)

/** What a progress batch will store, decided before anything is written. */
export interface ProgressPlan {
  readonly results: ReadonlyArray<Acceptance>
  /** Events to insert, each stamped with its acceptance time. */
  readonly fresh: ReadonlyArray<StoredEvent>
  /** The assignment after the batch (unchanged when nothing is fresh). */
  readonly assignment: Assignment.Assignment
}

/**
 * Plans a progress batch against the stored timeline (`stored` may hold only the
 * events of the batch's sequences): duplicates return their original acceptance,
 * conflicting resubmissions and illegal events refuse the whole batch, and fresh
 * events need a live reservation.
 */
export const planProgress = (
  a: Assignment.Assignment,
  stored: ReadonlyArray<StoredEvent>,
  batch: ReadonlyArray<PhaseModel.Event>,
  now: number
): Either.Either<ProgressPlan, ReservationRefused | ProgressRejected> => {
  // Per event this allocates only its answer and, when fresh, its stored form: the ingest
  // path runs it for every event a fleet reports.
  const bySeq = stored.length === 0 ? undefined : new Map<number, StoredEvent>(stored.map((e) => [e.seq, e]))
  let phase = a.lastPhase
  let lastSeq = a.lastSeq
  const results: Array<Acceptance> = []
  const fresh: Array<StoredEvent> = []
  for (const e of batch) {
    if (e.seq <= lastSeq) {
      // This batch's fresh events are consecutive from the stored end: fresh[k] has sequence a.lastSeq + 1 + k.
      const prior = e.seq > a.lastSeq ? fresh[e.seq - a.lastSeq - 1] : bySeq?.get(e.seq)
      if (!prior || !sameEvent(prior, e))
        return Either.left(new ProgressRejected({ reason: "conflict", seq: e.seq, phase: e.phase, message: `sequence ${e.seq} was already accepted with different content` }))
      results.push({ seq: e.seq, status: "duplicate", acceptedAt: prior.acceptedAt })
      continue
    }
    if (fresh.length === 0) {
      const live = requireLive(a, now)
      if (Either.isLeft(live)) return Either.left(live.left)
    }
    const refused = PhaseModel.refuseNext(phase, lastSeq, e)
    if (refused !== undefined) return Either.left(new ProgressRejected({ reason: refused.reason, seq: e.seq, phase: e.phase, message: refused.message }))
    phase = e.phase
    lastSeq = e.seq
    // Built field by field: a spread with an added field is far slower in V8, per event.
    fresh.push(
      e.detail === undefined
        ? { seq: e.seq, kind: e.kind, phase: e.phase, at: e.at, acceptedAt: now }
        : { seq: e.seq, kind: e.kind, phase: e.phase, at: e.at, detail: e.detail, acceptedAt: now }
    )
    results.push({ seq: e.seq, status: "accepted", acceptedAt: now })
  }
  if (fresh.length === 0) return Either.right({ results, fresh, assignment: a })
  return Either.right({ results, fresh, assignment: { ...a, lastPhase: phase, lastSeq, lastProgressAt: now } })
}
