import type { Target } from "./Target.js"
import { hasRemoteTimestamp } from "./Source.js"

/** Why a known target is not promoted. A closed set. */
export type SkipReason =
  | "not_completed"
  | "source_not_promotable"
  | "no_valid_timestamp"
  | "no_baseline"
  | "not_newer"
  | "cooldown"

/** The promotion decision for one target. */
export type Decision = { readonly _tag: "promote" } | { readonly _tag: "skip"; readonly reason: SkipReason }

/** Per-source promotion settings. */
export interface Rule {
  /** Minimum time since the target's last scan started, milliseconds. */
  readonly cooldownMs: number
}

/** The settings of one discovery cycle's promotion. */
export interface CycleRule extends Rule {
  /** Hard maximum of promotions in this cycle for this source. */
  readonly budget: number
}

/**
 * The remote time a target's latest scan is taken to cover: the claimed
 * snapshot, or for a legacy row that never had one, its completion time.
 */
export const coverageBasis = (t: Target): number | null => t.coveredRemoteAt ?? t.completedAt

/** When the target was last scanned, for cooldown and ordering (legacy rows: completion). */
export const lastScanAt = (t: Target): number => t.lastScanStartedAt ?? t.completedAt ?? 0

/**
 * Decides whether one known target is promoted back to `pending`.
 *
 * @example
 * decide(target, { cooldownMs: 3_600_000 }, Date.now())
 */
export const decide = (t: Target, rule: Rule, now: number): Decision => {
  const skip = (reason: SkipReason): Decision => ({ _tag: "skip", reason })
  if (t.status !== "completed") return skip("not_completed")
  if (!hasRemoteTimestamp(t.source)) return skip("source_not_promotable")
  if (t.observedRemoteAt === null) return skip("no_valid_timestamp")
  const basis = coverageBasis(t)
  if (basis === null) return skip("no_baseline")
  if (!(t.observedRemoteAt > basis)) return skip("not_newer")
  if (now - lastScanAt(t) < rule.cooldownMs) return skip("cooldown")
  return { _tag: "promote" }
}

/** True when the target would be promoted, budget aside. */
export const isEligible = (t: Target, rule: Rule, now: number): boolean => decide(t, rule, now)._tag === "promote"

/**
 * The documented order among eligible targets: longest since last scan first,
 * then lowest id. A waiting target only ever has targets scanned before it
 * ahead of it, and each promoted one moves behind it once rescanned, so with a
 * positive budget no eligible target waits forever.
 */
export const order = (a: Target, b: Target): number => lastScanAt(a) - lastScanAt(b) || a.id - b.id

/** The outcome of a cycle's budgeted selection. */
export interface Selection {
  /** Promoted this cycle, in order; never more than the budget. */
  readonly promote: ReadonlyArray<Target>
  /** Eligible but over budget: they stay completed and eligible for later cycles. */
  readonly deferred: ReadonlyArray<Target>
}

/** Selects at most `budget` eligible targets in the documented order. */
export const select = (targets: Iterable<Target>, rule: CycleRule, now: number): Selection => {
  const eligible: Array<Target> = []
  for (const t of targets) if (isEligible(t, rule, now)) eligible.push(t)
  eligible.sort(order)
  const n = Math.max(0, Math.floor(rule.budget))
  return { promote: eligible.slice(0, n), deferred: eligible.slice(n) }
}

/**
 * How far a promotion counts the eligible targets its budget left behind. Past
 * this many, `deferred` reads "at least this many": counting every eligible row
 * would make each promotion cost grow with the table instead of the budget.
 */
export const deferredCountLimit = 10_000

/** The deferred figure a promotion reports: exact below the limit, the limit itself at or above it. */
export const deferredCount = (eligibleLeft: number, limit: number = deferredCountLimit): number => {
  const cap = Number.isNaN(limit) ? deferredCountLimit : Math.max(0, Math.floor(limit))
  return Math.max(0, Math.min(eligibleLeft, cap))
}

/** The authority change of a promotion: back to pending, fence bumped, a fresh expiry budget for the newer revision (`Retry`). */
export const promote = (t: Target): Target => ({ ...t, status: "pending", fence: t.fence + 1, attempts: 0 })
