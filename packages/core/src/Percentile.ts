import { z } from "zod"
import { StoreError } from "./Errors.js"

/** The duration metrics recorded when an assignment ends. */
export const metrics = ["end_to_end", "scanning", "cleanup", "bundling", "upload"] as const
/** One duration metric. */
export type Metric = (typeof metrics)[number]
/** zod schema of a metric name. */
export const MetricSchema = z.enum(metrics)

/** The percentiles reported. */
export const levels = [0.5, 0.95, 0.99] as const

/**
 * The method: linear interpolation between closest ranks (the same as
 * PostgreSQL's `percentile_cont`): rank = p·(n−1) over the ascending values.
 *
 * @example
 * cont([10, 20, 30, 40], 0.5) // 25
 */
export const cont = (sorted: ReadonlyArray<number>, p: number): number => {
  const n = sorted.length
  if (n === 0 || !(p >= 0 && p <= 1)) return Number.NaN
  const r = p * (n - 1)
  const lo = Math.floor(r)
  const a = sorted[lo], b = sorted[Math.ceil(r)]
  return between(a, b, r - lo)
}

// Linear interpolation from a to b (a ≤ b) by the fraction f.
const between = (a: number, b: number, f: number): number => {
  if (a === b) return a
  const d = b - a
  // Far-apart values overflow b − a; halving both keeps the step finite. The clamp
  // keeps rounding inside [a, b], which is what makes cont monotone in p.
  const v = Number.isFinite(d) ? a + d * f : 2 * (a / 2 + (b / 2 - a / 2) * f)
  return Math.min(b, Math.max(a, v))
}

/** A percentile, or the label that there are too few samples to state one. */
export type Quantile =
  | { readonly status: "ok"; readonly value: number }
  | { readonly status: "insufficient"; readonly count: number; readonly required: number }

/** p50/p95/p99 of one group of observations, with its sample count. */
export interface Summary {
  readonly count: number
  readonly p50: Quantile
  readonly p95: Quantile
  readonly p99: Quantile
}

/** Labels raw percentile values: each is insufficient below `minSamples` observations. */
export const label = (count: number, values: readonly [number, number, number], minSamples: number): Summary => {
  const q = (v: number): Quantile =>
    count < minSamples || !Number.isFinite(v) ? { status: "insufficient", count, required: minSamples } : { status: "ok", value: v }
  return { count, p50: q(values[0]), p95: q(values[1]), p99: q(values[2]) }
}

/** Summarises raw durations (milliseconds). */
export const summarize = (values: ReadonlyArray<number>, minSamples: number): Summary => {
  const sorted = [...values].sort((a, b) => a - b)
  return label(sorted.length, [cont(sorted, 0.5), cont(sorted, 0.95), cont(sorted, 0.99)], minSamples)
}

/**
 * The relative accuracy of the log-bucket histogram: a bucket's representative
 * is within this fraction of every value in the bucket, so a percentile read
 * from merged bucket counts is within it of `cont` over the raw values.
 */
export const accuracy = 0.009

/** The ratio between consecutive bucket bounds: (1 + accuracy) / (1 − accuracy). */
export const gamma = (1 + accuracy) / (1 - accuracy)

/** ln(gamma): bucket i's upper bound is exp(i · lnGamma). */
export const lnGamma = Math.log(gamma)

/** Durations below this (one nanosecond, in ms) count as 0; so do negative ones. */
export const floorMs = 1e-6

/** Durations above this count as this, so a bucket is always a finite integer. */
export const ceilingMs = 1e300

/**
 * A duration as every store keeps it: NaN and −∞ are 0 (as `bucketOf` counts them), +∞ is
 * `ceilingMs`, anything else as given. So no store refuses one, or sorts it elsewhere.
 */
export const storedMs = (ms: number): number => (Number.isNaN(ms) || ms === -Infinity ? 0 : ms === Infinity ? ceilingMs : ms)

/** The earliest and latest instants a window may name: JavaScript's date range, in ms. */
export const maxInstant = 8_640_000_000_000_000

/**
 * A window [from, to) as every store reads it: bounds past JavaScript's date range are
 * clamped to it, fractional ones rounded up (for durations ended at whole milliseconds,
 * the same window), and a window with a bound that is not a number is empty.
 */
export const windowOf = (from: number, to: number): { readonly from: number; readonly to: number } => {
  if (Number.isNaN(from) || Number.isNaN(to)) return { from: 0, to: 0 }
  return { from: instantOf(from), to: instantOf(to) }
}

// An instant rounded up to a whole millisecond and clamped to JavaScript's date range.
const instantOf = (t: number): number => Math.min(maxInstant, Math.max(-maxInstant, Math.ceil(t)))

/**
 * Durations as every store keeps them: `ms` as `storedMs` gives it, and the instant each ended
 * (`at`) rounded up to a whole millisecond, as `windowOf` reads a window's bounds. A batch holding
 * an `at` that is not an instant of JavaScript's date range (NaN, infinite, beyond `maxInstant`)
 * is `undefined`: every store refuses the whole batch.
 */
export const storedDurations = <D extends { readonly ms: number; readonly at: number }>(ds: ReadonlyArray<D>): ReadonlyArray<D> | undefined =>
  ds.every((d) => Math.abs(d.at) <= maxInstant) ? ds.map((d) => ({ ...d, ms: storedMs(d.ms), at: instantOf(d.at) })) : undefined

/** What every store answers for a batch `storedDurations` refuses. */
export const unstorable = (): StoreError => new StoreError({ reason: "invalid", message: "a duration's at (when it ended) must be an instant in ms within JavaScript's date range" })

/** The bucket of 0 (and of every duration below `floorMs`); below every other bucket. */
export const zeroBucket = -100_000

/**
 * The log bucket of a duration: bucket i holds (gamma^(i−1), gamma^i].
 *
 * @example
 * valueOf(bucketOf(1234)) // 1234 within 0.9%
 */
export const bucketOf = (ms: number): number =>
  !(ms >= floorMs) ? zeroBucket : Math.ceil(Math.log(Math.min(ms, ceilingMs)) / lnGamma)

/** A bucket's representative: the value within `accuracy` of both of its bounds. */
export const valueOf = (bucket: number): number =>
  bucket <= zeroBucket ? 0 : (Math.exp(bucket * lnGamma) * 2) / (1 + gamma)

/** Counts by bucket. Histograms of disjoint samples merge by adding counts. */
export type Histogram = ReadonlyMap<number, number>

/** The histogram of raw durations. */
export const histogram = (values: Iterable<number>): Histogram => {
  const h = new Map<number, number>()
  for (const v of values) {
    const b = bucketOf(v)
    h.set(b, (h.get(b) ?? 0) + 1)
  }
  return h
}

/** The histogram of the union of two samples. */
export const merge = (a: Histogram, b: Histogram): Histogram => {
  const h = new Map(a)
  for (const [k, n] of b) h.set(k, (h.get(k) ?? 0) + n)
  return h
}

/** The ranks that `cont` interpolates between at level p, over n values: ⌊p·(n−1)⌋ and ⌈p·(n−1)⌉. */
export const ranks = (n: number, p: number): readonly [number, number] => {
  const r = p * (n - 1)
  return [Math.floor(r), Math.ceil(r)]
}

/**
 * A percentile from the buckets holding its two closest ranks (see `ranks`):
 * `cont`'s interpolation between their representatives.
 */
export const fromBuckets = (n: number, p: number, lo: number, hi: number): number => {
  const r = p * (n - 1)
  return between(valueOf(lo), valueOf(hi), r - Math.floor(r))
}

/**
 * A percentile from bucket counts, by `cont`'s rank rule: within `accuracy`
 * (relative) of `cont` over the raw values, plus `floorMs` absolute.
 */
export const quantile = (h: Histogram, p: number): number => {
  const entries = [...h.entries()].filter(([, c]) => c > 0).sort((a, b) => a[0] - b[0])
  const n = entries.reduce((s, [, c]) => s + c, 0)
  if (n === 0 || !(p >= 0 && p <= 1)) return Number.NaN
  const [lo, hi] = ranks(n, p)
  let seen = 0
  let bLo = Number.NaN
  for (const [b, c] of entries) {
    seen += c
    if (Number.isNaN(bLo) && seen > lo) bLo = b
    if (seen > hi) return fromBuckets(n, p, bLo, b)
  }
  return Number.NaN
}

/** Summarises bucket counts as `summarize` does raw durations, within `accuracy`. */
export const summarizeHistogram = (h: Histogram, minSamples: number): Summary => {
  let n = 0
  for (const c of h.values()) n += c
  return label(n, [quantile(h, 0.5), quantile(h, 0.95), quantile(h, 0.99)], minSamples)
}
