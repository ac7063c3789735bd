import type { FailureBackoff, ManagedConfig } from "./Config.js"
import { hasRemoteTimestamp, type Source } from "./Source.js"
import type { Status, Target } from "./Target.js"

/**
 * Retries are counted per covered revision. Two budgets apply:
 *
 * - the expiry budget: `Target.attempts` counts claims since the target last entered the queue
 *   for a new revision (a promotion) or a redrive; an expiry re-queues while it is below
 *   `expiry.maxAttempts`, so a promotion always starts with the whole budget;
 * - the failure backoff: a `failed` or `unresolved` target is redriven to `pending` after
 *   `delayMs(policy, n)` for its n-th redrive at the same covered revision, at most
 *   `maxRedrives` times; a newer observed revision redrives it at once with a fresh count.
 */

/** The backoff of a source whose configuration names none: 5 minutes, doubling, at most 6 hours, 5 redrives. */
export const defaultBackoff: FailureBackoff = { initialSeconds: 300, maxSeconds: 21_600, maxRedrives: 5 }

/** The failure backoff in force for a source. */
export const backoffOf = (c: ManagedConfig, source: Source): FailureBackoff => c.sources[source].failureBackoff ?? defaultBackoff

/** True for the statuses the failure backoff applies to. */
export const isRedrivable = (s: Status): s is "failed" | "unresolved" => s === "failed" || s === "unresolved"

/** What a store keeps per target for the failure backoff. */
export interface RedriveState {
  /** Redrives made at `revision`. */
  readonly redrives: number
  /** The covered revision those redrives were made at. */
  readonly revision: number | null
  /** When the current failure is due for a redrive (null: never, by backoff), once planned. */
  readonly retryAt: number | null
  /** The fence the plan was made at; a plan of another fence is no plan for the current failure. */
  readonly plannedFence: number | null
}

/** The state of a target that has never been redriven. */
export const initialState: RedriveState = { redrives: 0, revision: null, retryAt: null, plannedFence: null }

/** Redrives already made at the target's current covered revision. */
export const redrivesAt = (t: Target, s: RedriveState): number => (s.revision === t.coveredRemoteAt ? s.redrives : 0)

/** The wait before the redrive numbered `redrives` (0 first): exponential, capped, in milliseconds. */
export const delayMs = (p: FailureBackoff, redrives: number): number =>
  Math.min(p.maxSeconds, p.initialSeconds * 2 ** Math.max(0, Math.min(redrives, 60))) * 1000

/** True when discovery saw a newer valid revision than the one the last scan covered. */
export const newerRevision = (t: Target): boolean =>
  hasRemoteTimestamp(t.source) && t.observedRemoteAt !== null && (t.coveredRemoteAt === null || t.observedRemoteAt > t.coveredRemoteAt)

/** Whether the target is still planned (true when the plan was made at the current fence). */
export const isPlanned = (t: Target, s: RedriveState): boolean => s.plannedFence === t.fence

/**
 * Plans a failed target's next redrive: `failedAt` (when its last assignment ended) plus the
 * backoff for the redrives made at its revision, or null once they are spent.
 */
export const plan = (t: Target, s: RedriveState, p: FailureBackoff, failedAt: number): RedriveState => {
  const n = redrivesAt(t, s)
  return { ...s, retryAt: n >= p.maxRedrives ? null : failedAt + delayMs(p, n), plannedFence: t.fence }
}

/** Why a planned failed target is redriven now. */
export type Reason = "newer_revision" | "backoff"

/** The redrive decision for one planned target at `now`; null when it stays where it is. */
export const decide = (t: Target, s: RedriveState, now: number): Reason | null => {
  if (!isRedrivable(t.status) || !isPlanned(t, s)) return null
  if (newerRevision(t)) return "newer_revision"
  return s.retryAt !== null && s.retryAt <= now ? "backoff" : null
}

/**
 * The authority change of a redrive: back to pending, fence bumped, a fresh expiry budget; a
 * backoff redrive is counted at the target's revision (a newer revision starts at zero).
 */
export const redrive = (t: Target, s: RedriveState, reason: Reason): { readonly target: Target; readonly state: RedriveState } => ({
  target: { ...t, status: "pending", fence: t.fence + 1, attempts: 0 },
  state:
    reason === "backoff"
      ? { redrives: redrivesAt(t, s) + 1, revision: t.coveredRemoteAt, retryAt: null, plannedFence: null }
      : { redrives: 0, revision: null, retryAt: null, plannedFence: null }
})

/** The documented order of due redrives: earliest due first (newer revisions, due at once, by id), then lowest id. */
export const order = (a: { readonly t: Target; readonly s: RedriveState }, b: { readonly t: Target; readonly s: RedriveState }): number =>
  dueKey(a) - dueKey(b) || a.t.id - b.t.id

const dueKey = (x: { readonly t: Target; readonly s: RedriveState }) => (newerRevision(x.t) ? 0 : (x.s.retryAt ?? Number.MAX_SAFE_INTEGER))
