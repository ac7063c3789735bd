import { z } from "zod"
import type { Source } from "./Source.js"

/** Lifecycle statuses of a target. */
export const statuses = ["pending", "in_progress", "completed", "failed", "deferred", "unresolved"] as const

/** A target's lifecycle status. `in_progress` means claimed, leased and reserved. */
export type Status = (typeof statuses)[number]

/** zod schema of a status. */
export const StatusSchema = z.enum(statuses)

/** A target row as every store keeps it. Times are UTC epoch milliseconds. */
export interface Target {
  readonly id: number
  readonly source: Source
  readonly identity: string
  readonly status: Status
  /** Newest valid remote content-update time discovery has seen; only moves forward. */
  readonly observedRemoteAt: number | null
  /** The remote time the latest claim covered; set only by a successful claim. */
  readonly coveredRemoteAt: number | null
  readonly completedAt: number | null
  readonly lastScanStartedAt: number | null
  /** Incremented by every authority change (claim, promotion, release, expiry). */
  readonly fence: number
  /** Claims since the last promotion or redrive (`Retry`); expiry re-queues while below the configured maximum. */
  readonly attempts: number
  readonly discoveredAt: number
  /** Operator priority in [`Priority.min`, `Priority.max`]; claims take higher ones ahead of id order, bounded (`Priority`). */
  readonly priority: number
}

/** One discovery record for the store: identity plus its normalised remote time. */
export interface Observation {
  readonly source: Source
  readonly identity: string
  /** Valid remote content-update time, or null when the record had none. */
  readonly remoteAt: number | null
}

/** Merges a new observation into `observed_remote_at`: it only moves forward. */
export const mergeObserved = (current: number | null, observed: number | null): number | null =>
  observed === null ? current : current === null ? observed : Math.max(current, observed)

/** A new target admitted from an observation. */
export const admit = (id: number, o: Observation, now: number): Target => ({
  id,
  source: o.source,
  identity: o.identity,
  status: "pending",
  observedRemoteAt: o.remoteAt,
  coveredRemoteAt: null,
  completedAt: null,
  lastScanStartedAt: null,
  fence: 0,
  attempts: 0,
  discoveredAt: now,
  priority: 0
})

/** Records an observation on a known target: only `observedRemoteAt` may change. */
export const observe = (t: Target, o: Observation): Target => {
  const next = mergeObserved(t.observedRemoteAt, o.remoteAt)
  return next === t.observedRemoteAt ? t : { ...t, observedRemoteAt: next }
}
