import { Percentile } from "@scanfleet/core"

/** The rollup spans migration 0005 maintains (ms), longest first. */
export const spans: ReadonlyArray<number> = [86_400_000, 21_600_000, 3_600_000, 600_000]

/** Log buckets per rollup row: chunk = bucket >> 5, column c<bucket & 31>. */
export const width = 32

/**
 * A stretch of a percentile window, added to the window's counts or taken from them
 * (`sign`): whole rollups of one span, or raw rows.
 */
export type Part =
  | { readonly _tag: "rollup"; readonly sign: 1 | -1; readonly span: number; readonly from: number; readonly to: number }
  | { readonly _tag: "raw"; readonly sign: 1 | -1; readonly from: number; readonly to: number }

/** What a plan costs to read, in rollup rows of one start: a minute of raw rows is taken to cost two. */
const rawCostPerMs = 2 / 60_000

interface Plan {
  readonly cost: number
  readonly parts: ReadonlyArray<Part>
}

const flip = (parts: ReadonlyArray<Part>): ReadonlyArray<Part> => parts.map((p) => ({ ...p, sign: p.sign === 1 ? -1 : 1 }))

/**
 * The cheapest signed parts that count exactly [a, b) from spans[level] down. At each span
 * either the span is left to the shorter ones, or whole rollups [lo, hi) are read, each of
 * lo and hi the span's boundary just inside or just outside the window's edge; what lies
 * between an edge and its boundary is then added (inside) or taken away (outside), from the
 * shorter spans.
 */
const cheapest = (a: number, b: number, level: number, seen: Map<string, Plan>): Plan => {
  if (!(a < b)) return { cost: 0, parts: [] }
  const s = spans[level]
  if (s === undefined) return { cost: (b - a) * rawCostPerMs, parts: [{ _tag: "raw", sign: 1, from: a, to: b }] }
  // the edges of different choices share their stretches: each is planned once
  const key = `${a} ${b} ${level}`
  const known = seen.get(key)
  if (known) return known
  let best = cheapest(a, b, level + 1, seen)
  // [x, y) from the shorter spans, added; when x > y, [y, x) taken away
  const edge = (x: number, y: number): Plan => {
    if (x <= y) return cheapest(x, y, level + 1, seen)
    const away = cheapest(y, x, level + 1, seen)
    return { cost: away.cost, parts: flip(away.parts) }
  }
  for (const lo of new Set([Math.ceil(a / s) * s, Math.floor(a / s) * s]))
    for (const hi of new Set([Math.floor(b / s) * s, Math.ceil(b / s) * s])) {
      if (!(lo < hi && Number.isSafeInteger(lo) && Number.isSafeInteger(hi))) continue
      const left = edge(a, lo)
      const right = edge(hi, b)
      const cost = (hi - lo) / s + left.cost + right.cost
      // the first found wins a tie: inside boundaries before outside ones, as a plan that only adds
      if (cost < best.cost) best = { cost, parts: [...left.parts, { _tag: "rollup", sign: 1, span: s, from: lo, to: hi }, ...right.parts] }
    }
  seen.set(key, best)
  return best
}

/**
 * Splits [from, to) into whole days and, towards its edges, whole six hours, hours and ten
 * minutes, and the raw rows of what is left at its two ends, choosing at each edge whether
 * to round inwards and add what remains or outwards and take the excess away: a window that
 * starts at 00:39 reads its first day whole, takes away the day's first hour and adds back
 * two ten-minute rollups and a minute of raw rows, instead of adding a minute, two ten
 * minutes, five hours and three six hours. The parts are the cheapest such plan (rollup
 * starts, a raw minute costing two), never costlier than rounding every edge inwards; their
 * signed counts count every instant of [from, to) once and every other instant not at all,
 * so the merged counts are those of the window itself.
 */
export const plan = (from: number, to: number): ReadonlyArray<Part> => cheapest(from, to, 0, new Map()).parts

/** Core's `Percentile.bucketOf` as a SQL expression over a column; the same text as migration 0005's. */
export const bucketSql = (column: string): string =>
  `CASE WHEN NOT (${column} >= 1e-6) THEN ${Percentile.zeroBucket} WHEN ${column} > 1e300 THEN ${Percentile.bucketOf(1e300)} ` +
  `ELSE CAST(ceil(ln(${column}) / ${Percentile.lnGamma}) AS INTEGER) END`
