import { Percentile } from "@scanfleet/core"

/** The rollup spans migration 0005 maintains (ms). */
export const HOUR = 3_600_000
export const DAY = 86_400_000

/** A stretch of a percentile window: whole rollups of one span, or raw rows. */
export type Part =
  | { readonly _tag: "rollup"; readonly span: number; readonly from: number; readonly to: number }
  | { readonly _tag: "raw"; readonly from: number; readonly to: number }

const up = (t: number, s: number) => Math.ceil(t / s) * s
const down = (t: number, s: number) => Math.floor(t / s) * s

/**
 * Splits [from, to) into whole days, whole hours at the edges of the days, and
 * the raw rows of the partial hours at the window's two ends: the parts are
 * disjoint and cover the window exactly, so the merged counts are those of the
 * window itself.
 */
export const plan = (from: number, to: number): ReadonlyArray<Part> => {
  if (!(from < to)) return []
  const hs = up(from, HOUR), he = down(to, HOUR)
  if (!(hs < he) || !Number.isSafeInteger(hs) || !Number.isSafeInteger(he)) return [{ _tag: "raw", from, to }]
  const parts: Array<Part> = []
  const rollup = (span: number, a: number, b: number) => a < b && parts.push({ _tag: "rollup", span, from: a, to: b })
  const ds = up(from, DAY), de = down(to, DAY)
  if (ds < de) {
    rollup(HOUR, hs, ds)
    rollup(DAY, ds, de)
    rollup(HOUR, de, he)
  } else rollup(HOUR, hs, he)
  if (from < hs) parts.unshift({ _tag: "raw", from, to: hs })
  if (he < to) parts.push({ _tag: "raw", from: he, to })
  return parts
}

/** Core's `Percentile.bucketOf` as a SQL expression over a column; the same text as migration 0005's. */
export const bucketSql = (column: string): string =>
  `CASE WHEN NOT (${column} >= 1e-6) THEN ${Percentile.zeroBucket} WHEN ${column} > 1e300 THEN ${Percentile.bucketOf(1e300)} ` +
  `ELSE CAST(ceil(ln(${column}) / ${Percentile.lnGamma}) AS INTEGER) END`
