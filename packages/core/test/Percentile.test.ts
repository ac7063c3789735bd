import { describe, expect, it } from "@effect/vitest"
import { FastCheck as fc } from "effect"
import { Percentile } from "@scanfleet/core"

const durations = fc.array(fc.integer({ min: 0, max: 3_600_000 }), { minLength: 1, maxLength: 60 })
const reals = fc.array(fc.double({ min: -1e15, max: 1e15, noNaN: true, noDefaultInfinity: true }), { minLength: 1, maxLength: 40 })
const sortAsc = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)

/**
 * The reference: PostgreSQL's percentile_cont in exact rational arithmetic.
 * With p = a/b the rank is a·(n−1)/b; the answer interpolates linearly
 * between the two sorted values around that rank.
 */
const reference = (sorted: ReadonlyArray<number>, a: number, b: number): number => {
  const num = a * (sorted.length - 1)
  const lo = Math.floor(num / b)
  const rem = num - lo * b
  if (rem === 0) return sorted[lo]
  const x = BigInt(sorted[lo]), y = BigInt(sorted[lo + 1])
  // x + (y − x)·rem/b, scaled by b to stay exact, then divided once.
  return Number(x * BigInt(b) + (y - x) * BigInt(rem)) / b
}

describe("Percentile", () => {
  it.prop("percentile cont matches the sorted-interpolation reference", [durations, fc.integer({ min: 1, max: 1000 }), fc.nat()], ([xs, b, k]) => {
    const a = k % (b + 1)
    const sorted = sortAsc(xs)
    const got = Percentile.cont(sorted, a / b)
    const want = reference(sorted, a, b)
    expect(Math.abs(got - want)).toBeLessThanOrEqual(1e-6 * Math.max(1, Math.abs(want)))
  })

  it.prop("percentile cont at the p50, p95 and p99 levels matches the reference", [durations], ([xs]) => {
    const sorted = sortAsc(xs)
    const s = Percentile.summarize(xs, 1)
    for (const [q, a] of [[s.p50, 50], [s.p95, 95], [s.p99, 99]] as const) {
      expect(q.status).toBe("ok")
      if (q.status === "ok") expect(Math.abs(q.value - reference(sorted, a, 100))).toBeLessThanOrEqual(1e-6 * Math.max(1, q.value))
    }
  })

  it.prop("percentile cont is monotone in p", [fc.oneof(durations, reals), fc.double({ min: 0, max: 1, noNaN: true }), fc.double({ min: 0, max: 1, noNaN: true })], ([xs, p, q]) => {
    const sorted = sortAsc(xs)
    const [lo, hi] = p <= q ? [p, q] : [q, p]
    expect(Percentile.cont(sorted, lo)).toBeLessThanOrEqual(Percentile.cont(sorted, hi))
  })

  it.prop(
    "percentile cont stays finite and monotone in p over the whole range of doubles",
    [fc.array(fc.double({ noNaN: true, noDefaultInfinity: true }), { minLength: 1, maxLength: 10 }), fc.double({ min: 0, max: 1, noNaN: true }), fc.double({ min: 0, max: 1, noNaN: true })],
    ([xs, p, q]) => {
      const sorted = sortAsc(xs)
      const [lo, hi] = p <= q ? [p, q] : [q, p]
      const a = Percentile.cont(sorted, lo), b = Percentile.cont(sorted, hi)
      expect(Number.isFinite(a) && Number.isFinite(b)).toBe(true)
      expect(a).toBeLessThanOrEqual(b)
    },
    // Regression: seed 703288465 found b − a overflowing to Infinity ([6.29e293, -1.80e308], p = 0 gave NaN).
    { fastCheck: { seed: 703288465, numRuns: 10_000 } }
  )

  it.prop("percentile cont lies between the smallest and the largest sample, and hits them at p = 0 and p = 1", [fc.oneof(durations, reals), fc.double({ min: 0, max: 1, noNaN: true })], ([xs, p]) => {
    const sorted = sortAsc(xs)
    const v = Percentile.cont(sorted, p)
    expect(v).toBeGreaterThanOrEqual(sorted[0])
    expect(v).toBeLessThanOrEqual(sorted[sorted.length - 1])
    expect(Percentile.cont(sorted, 0)).toBe(sorted[0])
    expect(Percentile.cont(sorted, 1)).toBe(sorted[sorted.length - 1])
  })

  it.prop("a percentile is insufficient below minSamples and states its count", [fc.array(fc.nat({ max: 10_000 }), { maxLength: 40 }), fc.integer({ min: 1, max: 50 })], ([xs, min]) => {
    const s = Percentile.summarize(xs, min)
    expect(s.count).toBe(xs.length)
    for (const q of [s.p50, s.p95, s.p99]) {
      if (xs.length < min) expect(q).toEqual({ status: "insufficient", count: xs.length, required: min })
      else expect(q.status).toBe("ok")
    }
  })

  it.prop("a summary does not depend on the order the durations arrived in", [durations, fc.integer({ min: 1, max: 10 })], ([xs, min]) => {
    expect(Percentile.summarize([...xs].reverse(), min)).toEqual(Percentile.summarize(xs, min))
  })

  it("percentile cont interpolates like PostgreSQL's percentile_cont", () => {
    expect(Percentile.cont([10, 20, 30, 40], 0.5)).toBe(25)
    expect(Percentile.cont([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.95)).toBeCloseTo(9.55, 10)
    expect(Percentile.cont([42], 0.99)).toBe(42)
    expect(Number.isNaN(Percentile.cont([], 0.5))).toBe(true)
    expect(Number.isNaN(Percentile.cont([1, 2], Number.NaN))).toBe(true)
    expect(Number.isNaN(Percentile.cont([1, 2], 1.5))).toBe(true)
  })
})
