import { describe, expect, it } from "@effect/vitest"
import { FastCheck as fc } from "effect"
import { Percentile } from "@scanfleet/core"
import Database from "better-sqlite3"
import * as Rollups from "../src/internal/Rollups.js"

const T0 = Date.UTC(2025, 0, 1)
const window = fc.tuple(fc.integer({ min: -10 * 86_400_000, max: 10 * 86_400_000 }), fc.integer({ min: -1000, max: 9 * 86_400_000 }))

describe("percentile rollups", () => {
  it.prop("the parts of a window are disjoint, aligned to their span and cover exactly [from, to)", [window], ([[start, len]]) => {
    const from = T0 + start, to = from + len
    const parts = Rollups.plan(from, to)
    if (!(from < to)) return void expect(parts).toEqual([])
    let at = from
    for (const p of parts) {
      expect(p.from).toBe(at)
      expect(p.to).toBeGreaterThan(p.from)
      if (p._tag === "rollup") {
        expect(p.from % p.span).toBe(0)
        expect(p.to % p.span).toBe(0)
      }
      at = p.to
    }
    expect(at).toBe(to)
  })

  it.prop("a window reads one stretch of days, at most two of each shorter span and at most two of raw rows", [window], ([[start, len]]) => {
    const parts = Rollups.plan(T0 + start, T0 + start + len)
    // one stretch of the longest span; of each shorter span, at most one at either edge
    Rollups.spans.forEach((s, i) => expect(parts.filter((p) => p._tag === "rollup" && p.span === s).length).toBeLessThanOrEqual(i === 0 ? 1 : 2))
    expect(parts.filter((p) => p._tag === "raw").length).toBeLessThanOrEqual(2)
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
