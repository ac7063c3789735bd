import { Context, Data, type Effect } from "effect"
import type { Assignment } from "./Assignment.js"
import type { FailureBackoff } from "./Config.js"
import type { NotFound, StoreError } from "./Errors.js"
import type * as PhaseModel from "./PhaseModel.js"
import * as Priority from "./Priority.js"
import type * as Retry from "./Retry.js"
import { sources, type Source } from "./Source.js"
import type { Device, PromoteResult, PromoteRule } from "./Store.js"
import type { Status, Target } from "./Target.js"

/** Who asked for an operator action and why; every mutating operation records it in the audit log. */
export interface Actor {
  readonly who: string
  readonly why: string
  readonly now: number
}

/** The operator actions the audit log names. A closed set. */
export const actions = [
  "add_targets",
  "requeue",
  "cancel",
  "set_priority",
  "pause_source",
  "resume_source",
  "set_device_sources",
  "revoke_device",
  "apply_config",
  "register_device"
] as const
/** One audited operator action. */
export type Action = (typeof actions)[number]

/** One audit log entry. */
export interface AuditEntry {
  readonly id: number
  readonly at: number
  readonly who: string
  readonly action: Action
  /** What the action was applied to, for example `github:o/r`, `reservation:12`, `device:3`, `source:gitlab`. */
  readonly subject: string
  readonly why: string
  /** Details of the action as JSON text (counts, previous values). */
  readonly detail: string
}

/** An operator refusal: the action does not apply to the subject as it stands; nothing changed. */
export class OperationRefused extends Data.TaggedError("OperationRefused")<{
  readonly reason: "in_progress" | "already_pending" | "not_active" | "revoked" | "invalid_priority"
  readonly message: string
}> {}

/** A target with the fields only operators see. */
export interface TargetDetail extends Target {
  readonly redrive: Retry.RedriveState
  /** The newest lifecycle time: discovery, the last scan start, completion or the end of its last assignment. */
  readonly changedAt: number
}

/** A cancelled reservation: who cancelled it, when and why. */
export interface Cancellation {
  readonly reservationId: number
  readonly at: number
  readonly who: string
  readonly why: string
}

/** One of a target's assignments with the part of its accepted timeline an inspection shows (`inspected`). */
export interface AssignmentDetail {
  readonly assignment: Assignment
  /** In sequence order: every phase event, and the newest `recent` events of any kind. */
  readonly timeline: ReadonlyArray<PhaseModel.Event & { readonly acceptedAt: number }>
  /** How many accepted events (older `recovered` ones) `timeline` leaves out; the store's `timeline(reservationId)` has them all. */
  readonly omittedEvents: number
  readonly cancellation: Cancellation | null
}

/**
 * How much of each timeline an inspection reads. A timeline holds each phase at most once
 * and up to `PhaseModel.maxSeq` events in all, the rest `recovered` ones, so every phase
 * event plus the newest `recent` keeps one inspection bounded whatever the devices sent.
 */
export interface TimelineView {
  /** The newest events of any kind shown besides the phase events (0: phase events only). */
  readonly recent: number
  /** Whether events carry their `detail` (up to 1,000 characters each). */
  readonly details: boolean
}

/** What the admin API's inspection shows of each timeline: the phase events, the newest 20 events, with details. */
export const apiTimeline: TimelineView = { recent: 20, details: true }

/** Whether an inspection under `view` shows the event with `seq` and `kind` of a timeline that reached `lastSeq` (sequences run 1..lastSeq without gaps). */
export const inspected = (e: { readonly seq: number; readonly kind: PhaseModel.Event["kind"] }, lastSeq: number, view: TimelineView): boolean =>
  e.kind === "phase" || e.seq > lastSeq - Math.max(0, Math.floor(view.recent))

/**
 * When a device last spoke through one of its assignments: the claim, the newest progress, and
 * the end when the device ended it (a result or a release); not the end the sweep gave it at
 * expiry, nor one an operator gave it (`endedByOperator`: cancelled, or its device revoked).
 */
export const contactOf = (a: Assignment, endedByOperator: boolean): number =>
  Math.max(a.issuedAt, a.lastProgressAt ?? 0, a.state === "expired" || endedByOperator ? 0 : (a.endedAt ?? 0))

/** The cancellation a revocation records for each reservation it ends: who revoked, and why, naming the device. */
export const revocationOf = (reservationId: number, deviceId: number, actor: Actor): Cancellation => ({
  reservationId,
  at: actor.now,
  who: actor.who,
  why: `device ${deviceId} revoked: ${actor.why}`
})

/** A target and its assignments, newest first. */
export interface Inspection {
  readonly target: TargetDetail
  readonly assignments: ReadonlyArray<AssignmentDetail>
}

/** A target list query; every filter optional, keyset paginated by id. */
export interface TargetQuery {
  readonly source?: Source
  readonly status?: Status
  readonly identityPrefix?: string
  /** Only targets whose `changedAt` is at or after this time. */
  readonly changedSince?: number
  /** The `next` of the previous page. */
  readonly after?: number
  readonly limit: number
}

/** One page of targets in id order, and the cursor of the next page (null on the last one). */
export interface TargetPage {
  readonly targets: ReadonlyArray<TargetDetail>
  readonly next: number | null
}

/** A source's runtime controls. */
export interface SourceControl {
  readonly source: Source
  readonly paused: boolean
  /** Who paused it, when and why (the last pause while it is paused). */
  readonly pausedAt: number | null
  readonly pausedBy: string | null
  readonly reason: string | null
}

/** A device as operators see it. */
export interface DeviceDetail extends Device {
  /** The sources it may claim (null: all). */
  readonly sources: ReadonlyArray<Source> | null
  /** Its last claim, progress or result the server accepted (null: none yet). */
  readonly lastContactAt: number | null
  readonly active: ReadonlyArray<Assignment>
}

/** What one redrive pass did. */
export interface RedriveResult {
  readonly redriven: ReadonlyArray<{ readonly identity: string; readonly reason: Retry.Reason }>
  /** Failures planned by this pass (their retry time fixed). */
  readonly planned: number
}

/** Assignments that ended in one time bucket, each counted once: completed, timed out (killed at the deadline), failed otherwise, expired, released. */
export interface OutcomeBucket {
  readonly start: number
  readonly completed: number
  readonly timedOut: number
  readonly failed: number
  readonly expired: number
  readonly released: number
}

/**
 * The one bucket an assignment in `state` with `outcome` counts in (null while active): an
 * assignment killed at its deadline is timed out and not also failed. Every count of outcomes
 * (the summary, the dashboard, the charts) uses it.
 */
export const bucketOf = (state: Assignment["state"], outcome: Assignment["outcome"]): keyof Omit<OutcomeBucket, "start"> | null =>
  state === "active" ? null : state === "completed" ? "completed" : state === "failed" ? (outcome === "killed_at_deadline" ? "timedOut" : "failed") : state

/** The bucket an assignment that ended counts in, or null when it has not ended. */
export const outcomeOf = (a: Assignment): keyof Omit<OutcomeBucket, "start"> | null => (a.endedAt === null ? null : bucketOf(a.state, a.outcome))

/** A held lease and its fencing token (strictly greater for every new holder). */
export interface Lease {
  readonly name: string
  readonly holder: string
  readonly token: number
  readonly expiresAt: number
}

/**
 * The operator port: inspect, steer and redrive the fleet, and the leases that serialise
 * discovery across server instances. Every method is atomic; every mutating one is fenced
 * like the Store's authority changes and records its `Actor` in the audit log in the same step.
 */
export class Operations extends Context.Tag("@scanfleet/core/Operations")<
  Operations,
  {
    /** Plans the retry time of newly failed targets of a source and redrives up to `limit` due ones (`Retry.decide`), in `Retry.order`. */
    readonly redriveDue: (source: Source, policy: FailureBackoff, now: number, limit: number) => Effect.Effect<RedriveResult, StoreError>
    /** Targets matching every filter, in id order, one page. */
    readonly listTargets: (q: TargetQuery) => Effect.Effect<TargetPage, StoreError>
    /** One target with every lifecycle field and its newest assignments (at most `limit`), each with its timeline as `view` bounds it (`inspected`). */
    readonly inspectTarget: (source: Source, identity: string, limit: number, view: TimelineView) => Effect.Effect<Inspection, NotFound | StoreError>
    /** Puts a target that is not in flight back to pending with fresh budgets (fence bumped). */
    readonly requeue: (source: Source, identity: string, actor: Actor) => Effect.Effect<TargetDetail, NotFound | OperationRefused | StoreError>
    /**
     * Sets a target's claim priority (`Priority`: an integer in [min, max], 0 by default), kept until
     * changed; claims take pending targets in `Priority.compare` order. Not an authority change.
     */
    readonly setPriority: (source: Source, identity: string, priority: number, actor: Actor) => Effect.Effect<TargetDetail, NotFound | OperationRefused | StoreError>
    /** Ends an active reservation (fenced: the device's next write is refused) and returns its target to pending. */
    readonly cancel: (reservationId: number, actor: Actor) => Effect.Effect<Assignment, NotFound | OperationRefused | StoreError>
    /** Pauses or resumes a source: a paused source is neither claimed nor discovered. */
    readonly setPaused: (source: Source, paused: boolean, actor: Actor) => Effect.Effect<SourceControl, StoreError>
    /** Every source's controls, in `Source.sources` order. */
    readonly sourceControls: () => Effect.Effect<ReadonlyArray<SourceControl>, StoreError>
    /** Restricts the sources a device may claim (null: all). */
    readonly setDeviceSources: (deviceId: number, only: ReadonlyArray<Source> | null, actor: Actor) => Effect.Effect<DeviceDetail, NotFound | StoreError>
    /** The claim filters of every device that has one, lowest id first (cheap: claims consult it through a cache). */
    readonly deviceFilters: () => Effect.Effect<ReadonlyArray<{ readonly deviceId: number; readonly sources: ReadonlyArray<Source> }>, StoreError>
    /** Every device, lowest id first, with its active reservations. */
    readonly listDevices: () => Effect.Effect<ReadonlyArray<DeviceDetail>, StoreError>
    /**
     * Revokes a device and ends its active reservations at once (fenced), their targets back to
     * pending, each recorded as a cancellation (`revocationOf`).
     */
    readonly revokeDevice: (deviceId: number, actor: Actor) => Effect.Effect<ReadonlyArray<Assignment>, NotFound | StoreError>
    /**
     * Assignments that ended in [from, to), counted per `bucketMs` bucket from `from` (every bucket listed,
     * empty ones as zeros); it reads the assignments of the window, so keep windows to what a chart shows.
     */
    readonly outcomesOverTime: (from: number, to: number, bucketMs: number) => Effect.Effect<ReadonlyArray<OutcomeBucket>, StoreError>
    /** Records an action performed through another port (for example `add_targets`). */
    readonly audit: (action: Action, subject: string, detail: unknown, actor: Actor) => Effect.Effect<AuditEntry, StoreError>
    /** Audit entries, newest first, before the entry id `before` when given. */
    readonly listAudit: (q: { readonly before?: number; readonly limit: number }) => Effect.Effect<ReadonlyArray<AuditEntry>, StoreError>
    /** The cancellation of a reservation, if an operator cancelled it. */
    readonly cancellation: (reservationId: number) => Effect.Effect<Cancellation | null, StoreError>
    /**
     * Takes or renews the lease `name` for `holder` until `now + ttlMs`: granted when it is free,
     * expired or already the holder's (the token stays while the holder renews); null when another holds it.
     */
    readonly acquireLease: (name: string, holder: string, ttlMs: number, now: number) => Effect.Effect<Lease | null, StoreError>
    /** The newest schema migration applied (null for a store without migrations, such as the memory model); it also proves the database answers. */
    readonly schemaVersion: () => Effect.Effect<number | null, StoreError>
    /**
     * Runs the Store's budgeted promotion only while `lease` is still held with its token, in one
     * transaction that holds the lease row: a holder whose lease was taken over promotes nothing
     * (null), so a source's per-cycle budget is spent by one instance at a time.
     */
    readonly promoteUnderLease: (lease: Lease, source: Source, rule: PromoteRule, now: number) => Effect.Effect<PromoteResult | null, StoreError>
    /** Gives a lease back, if `holder` still holds it with `token`. */
    readonly releaseLease: (name: string, holder: string, token: number) => Effect.Effect<void, StoreError>
  }
>() {}

/** The shape of an Operations implementation. */
export type OperationsShape = Context.Tag.Service<Operations>

/** The statuses an operator may requeue from; `in_progress` needs a cancel first. */
export const requeueRefusal = (t: Target): OperationRefused | null =>
  t.status === "in_progress"
    ? new OperationRefused({ reason: "in_progress", message: `${t.source}:${t.identity} is in progress: cancel its assignment first` })
    : t.status === "pending"
      ? new OperationRefused({ reason: "already_pending", message: `${t.source}:${t.identity} is already pending` })
      : null

/** The refusal of a priority outside [Priority.min, Priority.max], or null. */
export const priorityRefusal = (priority: number): OperationRefused | null =>
  Priority.isValid(priority)
    ? null
    : new OperationRefused({ reason: "invalid_priority", message: `priority ${priority} is not an integer in [${Priority.min}, ${Priority.max}]` })

/** The authority change of a requeue: pending, fence bumped, fresh expiry and redrive budgets. */
export const requeued = (t: Target): Target => ({ ...t, status: "pending", fence: t.fence + 1, attempts: 0 })

/** The subject name of a target in the audit log. */
export const targetSubject = (source: Source, identity: string) => `${source}:${identity}`

/** Every source's controls when nothing was ever paused. */
export const unpaused = (): ReadonlyArray<SourceControl> => sources.map((source) => ({ source, paused: false, pausedAt: null, pausedBy: null, reason: null }))

/** The sources a claim may take: those asked for (all when absent), within the device's filter, none paused. */
export const claimable = (
  asked: ReadonlyArray<Source> | undefined,
  deviceOnly: ReadonlyArray<Source> | null,
  controls: ReadonlyArray<SourceControl>
): ReadonlyArray<Source> | undefined => {
  const paused = new Set(controls.filter((c) => c.paused).map((c) => c.source))
  if (asked === undefined && deviceOnly === null && paused.size === 0) return undefined
  return (asked ?? sources).filter((s) => (deviceOnly === null || deviceOnly.includes(s)) && !paused.has(s))
}

/** Empty buckets covering [from, to) (at most 1000). */
export const emptyBuckets = (from: number, to: number, bucketMs: number): Array<OutcomeBucket> => {
  const n = Math.max(0, Math.min(1000, Math.ceil((to - from) / Math.max(1, bucketMs))))
  return Array.from({ length: n }, (_, i) => ({ start: from + i * bucketMs, completed: 0, timedOut: 0, failed: 0, expired: 0, released: 0 }))
}

/** The newest lifecycle time of a target, given the end of its last assignment. */
export const changedAt = (t: Target, lastEndedAt: number | null): number =>
  Math.max(t.discoveredAt, t.lastScanStartedAt ?? 0, t.completedAt ?? 0, lastEndedAt ?? 0)
