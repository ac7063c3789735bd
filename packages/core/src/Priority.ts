import { z } from "zod"
import type { Target } from "./Target.js"

/** The lowest priority an operator may set (work that may wait). */
export const min = -100
/** The highest priority an operator may set (urgent work). */
export const max = 100
/** Every target starts at this priority. */
export const normal = 0
/**
 * How many target ids one priority step is worth: a target of priority `p` is claimed as if it
 * had been discovered `p × step` targets earlier. The shift is bounded, so a high priority moves
 * work ahead of newer work and of at most `(p − q) × step` older targets of priority `q`.
 */
export const step = 10_000

/**
 * The most targets discovered after a pending target that can ever be claimed before it, whatever
 * priorities are set: `(max − min) × step`. Claims therefore never starve a target.
 */
export const overtakeBound = (max - min) * step

/** zod schema of a priority: an integer in [min, max]. */
export const PrioritySchema = z.number().int().min(min).max(max)

/** True for a priority an operator may set. */
export const isValid = (p: number): boolean => Number.isInteger(p) && p >= min && p <= max

/** The claim order key of a target: lower is claimed first (ties by id). Stores order their pending targets by it. */
export const claimKey = (t: Pick<Target, "id" | "priority">): number => t.id - t.priority * step

/** Claim order: by `claimKey`, then by id. */
export const compare = (a: Pick<Target, "id" | "priority">, b: Pick<Target, "id" | "priority">): number => claimKey(a) - claimKey(b) || a.id - b.id

/**
 * The claim order key as SQL over a `targets` row aliased `alias` (`c.id - c.priority * 10000`),
 * written from `step` so every dialect orders as `compare` does; the index of migration 0010 is
 * on exactly this expression, then id.
 */
export const claimKeySql = (alias: string): string => `${alias}.id - ${alias}.priority * ${step}`

/** A target at a new priority: not an authority change, so the fence stays. */
export const set = (t: Target, priority: number): Target => ({ ...t, priority })
