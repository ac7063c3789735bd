import { z } from "zod"

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
  if (a === b) return a
  const f = r - lo
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
