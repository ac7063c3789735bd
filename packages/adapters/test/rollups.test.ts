import { describe, expect, it } from "@effect/vitest"
import { FastCheck as fc } from "effect"
import { Percentile } from "@scanfleet/core"
import Database from "better-sqlite3"
import * as Rollups from "../src/internal/Rollups.js"

const T0 = Date.UTC(2025, 0, 1)
const window = fc.tuple(fc.integer({ min: -10 * 86_400_000, max: 10 * 86_400_000 }), fc.integer({ min: -1000, max: 9 * 86_400_000 }))

describe("percentile rollups", () => {
  // How many times the signed parts count instant t: +1 for each part added that holds it, -1
  // for each part taken away.
  const counted = (parts: ReadonlyArray<Rollups.Part>, t: number) => parts.reduce((n, p) => n + (p.from <= t && t < p.to ? p.sign : 0), 0)
  // The plan that only adds: every edge rounded inwards (the plan before parts could be taken away).
  const inwards = (from: number, to: number) => {
    const cost: Array<number> = []
    const go = (a: number, b: number, level: number): void => {
      if (!(a < b)) return
      const s = Rollups.spans[level]
      if (s === undefined) return void cost.push((b - a) / 30_000)
      const lo = Math.ceil(a / s) * s, hi = Math.floor(b / s) * s
      if (!(lo < hi)) return go(a, b, level + 1)
      go(a, lo, level + 1)
      cost.push((hi - lo) / s)
      go(hi, b, level + 1)
    }
    go(from, to, 0)
    return cost.reduce((x, y) => x + y, 0)
  }
  const costOf = (parts: ReadonlyArray<Rollups.Part>) => parts.reduce((n, p) => n + (p._tag === "rollup" ? (p.to - p.from) / p.span : (p.to - p.from) / 30_000), 0)

  it.prop(
    "the signed parts of a window count every instant of [from, to) once and every other instant not at all, each part aligned to its span",
    [window, fc.array(fc.integer({ min: -86_400_000, max: 86_400_000 }), { maxLength: 20 })],
    ([[start, len], offsets]) => {
      const from = T0 + start, to = from + len
      const parts = Rollups.plan(from, to)
      if (!(from < to)) return void expect(parts).toEqual([])
      for (const p of parts) {
        expect(p.to).toBeGreaterThan(p.from)
        if (p._tag === "rollup") {
          expect(p.from % p.span).toBe(0)
          expect(p.to % p.span).toBe(0)
        }
      }
      // the count can only change at a boundary: every boundary, either side, and instants around them
      const instants = [from, to, ...parts.flatMap((p) => [p.from, p.to])].flatMap((t) => [t - 1, t, t + 1])
      for (const t of [...instants, ...offsets.map((o) => from + o), ...offsets.map((o) => to + o)])
        expect(counted(parts, t), `instant ${t - from} after from`).toBe(from <= t && t < to ? 1 : 0)
    }
  )

  it.prop("a window's plan never reads more than rounding every edge inwards (rollup starts, a raw minute as two)", [window], ([[start, len]]) => {
    const from = T0 + start, to = from + len
    expect(costOf(Rollups.plan(from, to))).toBeLessThanOrEqual(inwards(from, to) + 1e-9)
  })

  it("a window of seven days cut mid-hour reads its days whole and takes away what lies outside it", () => {
    const end = Date.UTC(2026, 0, 8)
    const parts = Rollups.plan(end - 7 * 86_400_000 + 2_345_678, end - 1_234_567)
    // rounded inwards it was 26 rollup starts and 10.3 minutes of raw rows
    expect(parts.filter((p) => p._tag === "rollup" && p.span === 86_400_000)).toEqual([{ _tag: "rollup", sign: 1, span: 86_400_000, from: end - 7 * 86_400_000, to: end }])
    expect(parts.reduce((n, p) => n + (p._tag === "rollup" ? (p.to - p.from) / p.span : 0), 0)).toBeLessThanOrEqual(13)
    expect(parts.reduce((n, p) => n + (p._tag === "raw" ? p.to - p.from : 0), 0)).toBeLessThan(2 * 60_000)
  })

  it.prop(
    "the SQL bucket expression puts every duration in core's Percentile.bucketOf bucket",
    [fc.array(fc.oneof(fc.double({ min: 0, max: 1e12, noNaN: true }), fc.integer({ min: 0, max: 10_000_000 }), fc.constant(0)), { minLength: 1, maxLength: 50 })],
    ([xs]) => {
      const db = new Database(":memory:")
      const stmt = db.prepare(`SELECT ${Rollups.bucketSql("v")} AS b FROM (SELECT ? AS v)`)
      for (const x of xs) expect((stmt.get(x) as { b: number }).b, String(x)).toBe(Percentile.bucketOf(x))
      db.close()
    }
  )
})
