import { Percentile } from "@scanfleet/core"

/** The rollup spans migration 0005 maintains (ms), longest first. */
export const spans: ReadonlyArray<number> = [86_400_000, 21_600_000, 3_600_000, 600_000]

/** Log buckets per rollup row: chunk = bucket >> 5, column c<bucket & 31>. */
export const width = 32

/** A stretch of a percentile window: whole rollups of one span, or raw rows. */
export type Part =
  | { readonly _tag: "rollup"; readonly span: number; readonly from: number; readonly to: number }
  | { readonly _tag: "raw"; readonly from: number; readonly to: number }

/**
 * Splits [from, to) into whole days, then whole six hours, hours and ten minutes
 * towards its edges, and the raw rows of what is left at its two ends: the parts are
 * disjoint and cover the window exactly, so the merged counts are those of the
 * window itself.
 */
export const plan = (from: number, to: number): ReadonlyArray<Part> => {
  const parts: Array<Part> = []
  const go = (a: number, b: number, level: number): void => {
    if (!(a < b)) return
    const s = spans[level]
    const lo = s === undefined ? Number.NaN : Math.ceil(a / s) * s
    const hi = s === undefined ? Number.NaN : Math.floor(b / s) * s
    if (!(lo < hi && Number.isSafeInteger(lo) && Number.isSafeInteger(hi))) {
      if (s === undefined) parts.push({ _tag: "raw", from: a, to: b })
      else go(a, b, level + 1)
      return
    }
    go(a, lo, level + 1)
    parts.push({ _tag: "rollup", span: s, from: lo, to: hi })
    go(hi, b, level + 1)
  }
  go(from, to, 0)
  return parts
}

/** Core's `Percentile.bucketOf` as a SQL expression over a column; the same text as migration 0005's. */
export const bucketSql = (column: string): string =>
  `CASE WHEN NOT (${column} >= 1e-6) THEN ${Percentile.zeroBucket} WHEN ${column} > 1e300 THEN ${Percentile.bucketOf(1e300)} ` +
  `ELSE CAST(ceil(ln(${column}) / ${Percentile.lnGamma}) AS INTEGER) END`
