import { Context, Duration as EffectDuration, Effect, type Either } from "effect"
import type { Assignment, Duration, Outcome, Receipt } from "./Assignment.js"
import { defaults, type ManagedConfig } from "./Config.js"
import type { Cycle, CycleInput } from "./Discovery.js"
import type { ClaimRejected, NotFound, ProgressRejected, ReservationRefused, StoreError } from "./Errors.js"
import type { Metric, Summary } from "./Percentile.js"
import type * as PhaseModel from "./PhaseModel.js"
import type { Source } from "./Source.js"
import type { Observation, Status, Target } from "./Target.js"

/** What recording one discovery batch did. */
export interface RecordResult {
  /** Identities inserted as new pending targets. */
  readonly inserted: ReadonlyArray<string>
  /** How many records named a target that was already known. */
  readonly known: number
}

/** What one budgeted promotion did. */
export interface PromoteResult {
  readonly promoted: ReadonlyArray<string>
  /**
   * Eligible but left for later cycles by the budget, counted up to the rule's
   * `deferredLimit` (default `Promotion.deferredCountLimit`): a figure equal to the
   * limit means "at least", so the cost of a promotion follows its budget, not the table.
   */
  readonly deferred: number
}

/** The settings of one budgeted promotion. */
export interface PromoteRule {
  readonly budget: number
  readonly cooldownMs: number
  /** How far to count the eligible targets left behind (default `Promotion.deferredCountLimit`). */
  readonly deferredLimit?: number
}

/** A claim request for one device slot. */
export interface ClaimRequest {
  readonly deviceId: number
  readonly slot: number
  readonly now: number
  /** The managed configuration in force; the target's source selects its policy. */
  readonly config: ManagedConfig
  /** Only claim targets of these sources (all when absent). */
  readonly sources?: ReadonlyArray<Source>
  /** Optional cap on in-flight assignments per source, fleet-wide. */
  readonly sourceCap?: number
  /**
   * The instant (server clock) after which the claim must not commit, because its
   * client has given up waiting: refused with `ClaimRejected` `deadline_passed`.
   */
  readonly notAfter?: number
}

/**
 * The claim that follows a result in `submitResultAndClaim`: a slot of the result's device
 * and the claim's terms, as in `ClaimRequest`; the device and the time are the result's.
 */
export type NextClaim = Omit<ClaimRequest, "deviceId" | "now">

/** What `submitResultAndClaim` did: the result's receipt, then the claim's answer. */
export interface ResultAndClaim {
  readonly receipt: Receipt
  /** The slot's next assignment; null when nothing was pending or the claim was refused. */
  readonly next: Assignment | null
  /** Why the claim was refused, when it was; the result stands. */
  readonly claimRefused: ClaimRejected | null
}

/** A batch claim: one device takes up to one target for each of the listed free slots. */
export interface ClaimManyRequest {
  readonly deviceId: number
  /** The slots to fill, in the order they receive the lowest pending ids; each at most once. */
  readonly slots: ReadonlyArray<number>
  readonly now: number
  /** The managed configuration in force; each target's source selects its policy. */
  readonly config: ManagedConfig
  /** Only claim targets of these sources (all when absent). */
  readonly sources?: ReadonlyArray<Source>
  /** Optional cap on in-flight assignments per source, fleet-wide (the batch's own claims count). */
  readonly sourceCap?: number
  /** As in `ClaimRequest`: nothing commits after this instant. */
  readonly notAfter?: number
}

/** A worker write's credentials: the reservation and the fence it was issued with. */
export interface Authority {
  readonly deviceId: number
  readonly reservationId: number
  readonly fence: number
  readonly now: number
}

/** Per-event acceptance of a progress batch. */
export interface Acceptance {
  readonly seq: number
  readonly status: "accepted" | "duplicate"
  /** Server time the event was first accepted; a duplicate returns the original. */
  readonly acceptedAt: number
}

/** A result submission. */
export interface ResultInput extends Authority {
  readonly outcome: Outcome
  readonly finalPhase: PhaseModel.Phase | null
  /** The result document (findings and the bounded log), stored as JSON text. */
  readonly body: string
}

/** Expiry policy and bounds for one sweep. */
export interface SweepRequest {
  readonly now: number
  readonly maxAttempts: number
  readonly limit: number
}

/** A percentile query: every dimension optional, the window required. */
export interface PercentileQuery {
  readonly from: number
  readonly to: number
  readonly source?: Source
  readonly metric?: Metric
  readonly outcome?: Outcome
  readonly minSamples: number
}

/** One group of a percentile answer. */
export interface PercentileRow extends Summary {
  readonly source: Source
  readonly metric: Metric
  readonly outcome: Outcome
}

/** A registered worker device. */
export interface Device {
  readonly id: number
  readonly name: string
  readonly slots: number
  readonly createdAt: number
  readonly revokedAt: number | null
  /** The process containment the device last reported at registration (its worker's words), or null before the first report. */
  readonly containment: string | null
  /** When the device last reported, server clock. */
  readonly reportedAt: number | null
}

/** The fleet a database is: its id is chosen once, when the schema is created, and never changes. */
export interface Fleet {
  readonly id: string
  readonly createdAt: number
}

/** A stored configuration version. */
export interface ConfigVersion {
  readonly version: number
  readonly document: ManagedConfig
  readonly appliedBy: string
  readonly appliedAt: number
}

/** The managed configuration in force: the last applied version's document, else `Config.defaults`. */
export interface InForce {
  readonly document: ManagedConfig
  /** The version it is; null when none was ever applied (the defaults are in force). */
  readonly version: ConfigVersion | null
}

/** The configuration in force given the last applied version (`activeConfig`'s answer). */
export const inForce = (version: ConfigVersion | null): InForce => ({ document: version === null ? defaults : version.document, version })

/** How long `configInForce` keeps its copy of the configuration in force. */
export const inForceTtl = EffectDuration.seconds(1)

/** The configuration in force as claims read it (`configInForce`). */
export interface InForceCache {
  /** The copy, read again once `inForceTtl` has passed or after `invalidate`. */
  readonly current: Effect.Effect<InForce, StoreError>
  /** Drops the copy: a version applied through this process counts from the next read. */
  readonly invalidate: Effect.Effect<void>
}

/**
 * The configuration in force for a process's claims, kept for `ttl`: a claim then costs no read
 * of its own (on PostgreSQL, one statement less), and claims made meanwhile pass one object, which
 * merged claims compare by identity first. A version applied through this process counts at once
 * once its caller invalidates; one applied through another process or server instance on the
 * same database counts within `ttl`. Each assignment records the policy it was given, whichever
 * that was. A failed read is not kept.
 */
export const configInForce = (store: Pick<StoreShape, "activeConfig">, ttl: EffectDuration.DurationInput = inForceTtl): Effect.Effect<InForceCache> =>
  Effect.map(Effect.cachedInvalidateWithTTL(Effect.map(store.activeConfig(), inForce), ttl), ([cached, invalidate]) => ({
    current: Effect.tapError(cached, () => invalidate),
    invalidate
  }))

/** Assignments counted by state, source, outcome and last accepted phase, for dashboards and metrics. */
export interface AssignmentCount {
  readonly state: Assignment["state"]
  readonly source: Source
  readonly outcome: Outcome | null
  readonly lastPhase: PhaseModel.Phase | null
  readonly count: number
}

/** Discovery totals of one source over every recorded cycle. */
export interface CycleTotal {
  readonly source: Source
  readonly cycles: number
  readonly queuedNewCount: number
  readonly queuedUpdatedCount: number
}

/** The one order of aggregate rows every store returns: by state, source, outcome, then last phase (absent first). */
export const compareAssignmentCounts = (a: AssignmentCount, b: AssignmentCount): number =>
  cmp(a.state, b.state) || cmp(a.source, b.source) || cmp(a.outcome ?? "", b.outcome ?? "") || cmp(a.lastPhase ?? "", b.lastPhase ?? "")

const cmp = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0)

/** Store-wide counts for dashboards and metrics. */
export interface TargetCount {
  readonly source: Source
  readonly status: Status
  readonly count: number
}

/**
 * The storage port. Every method is atomic: one statement, or one transaction.
 * Authority changes are compare-and-set on (status, fence); every worker write
 * carries its reservation and fence and a superseded attempt is refused.
 */
export class Store extends Context.Tag("@scanfleet/core/Store")<
  Store,
  {
    /** Inserts new identities as pending and raises `observed_remote_at` of known ones; nothing else. One round trip per batch. */
    readonly recordObservations: (batch: ReadonlyArray<Observation>, now: number) => Effect.Effect<RecordResult, StoreError>
    /** Promotes at most `budget` eligible completed targets of a source, in core's order, with a fenced compare-and-set. */
    readonly promote: (source: Source, rule: PromoteRule, now: number) => Effect.Effect<PromoteResult, StoreError>
    /** Claims the next pending target for a device slot; `null` when nothing is pending. */
    readonly claim: (req: ClaimRequest) => Effect.Effect<Assignment | null, ClaimRejected | StoreError>
    /**
     * Claims up to one pending target per listed slot, lowest ids first, paired with the slots in
     * their order; fewer (or none) when fewer are pending. Refused as a whole, changing nothing,
     * for the first reason `claim` would give one of the slots (an unknown or revoked device, a
     * slot out of range, busy or listed twice).
     */
    readonly claimMany: (req: ClaimManyRequest) => Effect.Effect<ReadonlyArray<Assignment>, ClaimRejected | StoreError>
    /** Appends progress events idempotently by (reservation, sequence); never renews anything. */
    readonly appendProgress: (
      auth: Authority,
      events: ReadonlyArray<PhaseModel.Event>
    ) => Effect.Effect<{ readonly results: ReadonlyArray<Acceptance>; readonly assignment: Assignment }, ReservationRefused | ProgressRejected | StoreError>
    /** Accepts a result under the upload deadline, ends the assignment and records durations; a resubmission returns the original receipt. */
    readonly submitResult: (input: ResultInput) => Effect.Effect<Receipt, ReservationRefused | StoreError>
    /**
     * Accepts a batch of results, each judged on its own as `submitResult` judges it (a refused
     * result refuses only itself); the answers come in input order.
     */
    readonly submitResults: (inputs: ReadonlyArray<ResultInput>) => Effect.Effect<ReadonlyArray<Either.Either<Receipt, ReservationRefused>>, StoreError>
    /**
     * A worker's loop in one call: accepts a result as `submitResult` does, then claims `next.slot`
     * of the result's device at the result's time as `claim` does. A refused result fails as
     * `submitResult` fails and claims nothing; a repeated one (its receipt returned again) is
     * followed by the claim all the same. A refused claim leaves the result accepted and says why
     * in `claimRefused`. `resultThenClaim` composes it from the two operations; the SQL store on
     * PostgreSQL runs both in one statement, merged with concurrent calls.
     */
    readonly submitResultAndClaim: (input: ResultInput, next: NextClaim) => Effect.Effect<ResultAndClaim, ReservationRefused | StoreError>
    /** Gives an active reservation back: the target returns to pending. */
    readonly release: (auth: Authority) => Effect.Effect<Assignment, ReservationRefused | StoreError>
    /**
     * Expires active reservations past their immutable expiry, keeping the last phase and progress time as evidence.
     * A store may also do its periodic housekeeping here (PgStore folds pending percentile counts), as the sweeper calls it steadily.
     */
    readonly expireDue: (req: SweepRequest) => Effect.Effect<ReadonlyArray<Assignment>, StoreError>
    /** One assignment by reservation id. */
    readonly getAssignment: (reservationId: number) => Effect.Effect<Assignment, NotFound | StoreError>
    /** Assignments in a state, newest first. */
    readonly listAssignments: (q: { readonly state?: Assignment["state"]; readonly deviceId?: number; readonly limit: number }) => Effect.Effect<ReadonlyArray<Assignment>, StoreError>
    /** The accepted timeline of a reservation, in sequence order. */
    readonly timeline: (reservationId: number) => Effect.Effect<ReadonlyArray<PhaseModel.Event & { readonly acceptedAt: number }>, StoreError>
    /** One target by identity. */
    readonly getTarget: (source: Source, identity: string) => Effect.Effect<Target, NotFound | StoreError>
    /** Targets counted by source and status. */
    readonly countTargets: () => Effect.Effect<ReadonlyArray<TargetCount>, StoreError>
    /** Assignments counted by state, source, outcome and last phase, in `compareAssignmentCounts` order; one aggregate query. */
    readonly countAssignments: () => Effect.Effect<ReadonlyArray<AssignmentCount>, StoreError>
    /** Per-source totals over all cycles (queued new and updated), ordered by source; one aggregate query. */
    readonly cycleTotals: () => Effect.Effect<ReadonlyArray<CycleTotal>, StoreError>
    /** Stores a discovery cycle record. */
    readonly recordCycle: (c: CycleInput) => Effect.Effect<Cycle, StoreError>
    /** Recent cycle records, newest first. */
    readonly listCycles: (q: { readonly source?: Source; readonly limit: number }) => Effect.Effect<ReadonlyArray<Cycle>, StoreError>
    /** Records duration observations (the adapters also record them inside result acceptance). */
    readonly recordDurations: (ds: ReadonlyArray<Duration>) => Effect.Effect<void, StoreError>
    /**
     * p50/p95/p99 by source, metric and outcome inside a window [from, to), with exact
     * sample counts. Values come from log-bucket counts (`Percentile.quantile`): each is
     * within `Percentile.accuracy` (0.9%) relative, plus `Percentile.floorMs` absolute, of
     * `Percentile.cont` over the raw durations of exactly that window.
     */
    readonly percentiles: (q: PercentileQuery) => Effect.Effect<ReadonlyArray<PercentileRow>, StoreError>
    /** The configuration in force, or null before the first apply. */
    readonly activeConfig: () => Effect.Effect<ConfigVersion | null, StoreError>
    /** Stores a validated document as the next version. */
    readonly applyConfig: (document: ManagedConfig, appliedBy: string, now: number) => Effect.Effect<ConfigVersion, StoreError>
    /** Registers a device under the hash of its token. */
    readonly addDevice: (d: { readonly name: string; readonly slots: number; readonly tokenHash: string; readonly now: number }) => Effect.Effect<Device, StoreError>
    /** The live device whose token hashes to this value. */
    readonly deviceByTokenHash: (tokenHash: string) => Effect.Effect<Device | null, StoreError>
    /** Revokes a device; its token stops working at once. */
    readonly revokeDevice: (id: number, now: number) => Effect.Effect<void, NotFound | StoreError>
    /** Records what a live device reports when its worker starts (its containment level). */
    readonly reportDevice: (id: number, report: { readonly containment: string; readonly now: number }) => Effect.Effect<Device, NotFound | StoreError>
    /** The fleet this store is (one stable id per database). */
    readonly fleet: () => Effect.Effect<Fleet, StoreError>
  }
>() {}

/** The shape of a Store implementation. */
export type StoreShape = Context.Tag.Service<Store>

/**
 * `submitResultAndClaim` as the two operations it stands for, in order: the result, then
 * (once it is accepted) the claim of the next slot at the result's time, a refusal of the
 * claim kept as `claimRefused`. A store without a faster way uses it as it is; a store with one
 * (and a decorator of any store) keeps its meaning.
 */
export const resultThenClaim =
  (store: Pick<StoreShape, "submitResult" | "claim">) =>
  (input: ResultInput, next: NextClaim): Effect.Effect<ResultAndClaim, ReservationRefused | StoreError> =>
    Effect.flatMap(store.submitResult(input), (receipt) => claimAfter(store, input, next, receipt))

/** The claim of `resultThenClaim`, after the result was accepted with `receipt`. */
export const claimAfter = (
  store: Pick<StoreShape, "claim">,
  input: ResultInput,
  next: NextClaim,
  receipt: Receipt
): Effect.Effect<ResultAndClaim, StoreError> =>
  store.claim({ ...next, deviceId: input.deviceId, now: input.now }).pipe(
    Effect.map((a): ResultAndClaim => ({ receipt, next: a, claimRefused: null })),
    Effect.catchTag("ClaimRejected", (e) => Effect.succeed<ResultAndClaim>({ receipt, next: null, claimRefused: e }))
  )
