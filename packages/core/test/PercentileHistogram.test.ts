import { describe, expect, it } from "@effect/vitest"
import { FastCheck as fc } from "effect"
import { Percentile } from "@scanfleet/core"

// Any duration a fleet could report, from sub-nanosecond noise to centuries, with exact zeros.
const ms = fc.oneof(fc.double({ min: 0, max: 1e13, noNaN: true, noDefaultInfinity: true }), fc.constant(0), fc.integer({ min: 0, max: 3_600_000 }))
const samples = fc.array(ms, { minLength: 1, maxLength: 200 })
const level = fc.oneof(fc.constantFrom(...Percentile.levels), fc.double({ min: 0, max: 1, noNaN: true }))
const sortAsc = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)
const within = (got: number, want: number) => Math.abs(got - want) <= Percentile.accuracy * Math.abs(want) * (1 + 1e-9) + Percentile.floorMs

describe("Percentile histogram", () => {
  it.prop("a bucket's representative is within the stated accuracy of every duration in it", [ms], ([x]) => {
    expect(within(Percentile.valueOf(Percentile.bucketOf(x)), x)).toBe(true)
  })

  it.prop("buckets are ordered as durations are", [ms, ms], ([a, b]) => {
    if (a <= b) expect(Percentile.bucketOf(a)).toBeLessThanOrEqual(Percentile.bucketOf(b))
  })

  it.prop("relative error against cont is at most the stated accuracy (under 1%) for any sample and level", [samples, level], ([xs, p]) => {
    const exact = Percentile.cont(sortAsc(xs), p)
    const approx = Percentile.quantile(Percentile.histogram(xs), p)
    expect(within(approx, exact), `${approx} vs ${exact}`).toBe(true)
  })

  it.prop("merging histograms equals the histogram of the union", [samples, samples], ([xs, ys]) => {
    const merged = Percentile.merge(Percentile.histogram(xs), Percentile.histogram(ys))
    expect(new Map([...merged].sort((a, b) => a[0] - b[0]))).toEqual(new Map([...Percentile.histogram([...xs, ...ys])].sort((a, b) => a[0] - b[0])))
  })

  it.prop("a histogram summary counts every duration and labels like summarize", [samples, fc.integer({ min: 1, max: 300 })], ([xs, min]) => {
    const s = Percentile.summarizeHistogram(Percentile.histogram(xs), min)
    const exact = Percentile.summarize(xs, min)
    expect(s.count).toBe(xs.length)
    for (const q of ["p50", "p95", "p99"] as const) {
      const a = s[q], e = exact[q]
      expect(a.status).toBe(e.status)
      if (a.status === "ok" && e.status === "ok") expect(within(a.value, e.value)).toBe(true)
    }
  })

  it("the accuracy is under 1%, zero is exact and out-of-range durations still get a finite bucket", () => {
    expect(Percentile.accuracy).toBeLessThan(0.01)
    expect(Percentile.valueOf(Percentile.bucketOf(0))).toBe(0)
    expect(Percentile.bucketOf(-5)).toBe(Percentile.zeroBucket)
    expect(Percentile.bucketOf(Number.NaN)).toBe(Percentile.zeroBucket)
    expect(Number.isFinite(Percentile.valueOf(Percentile.bucketOf(Number.POSITIVE_INFINITY)))).toBe(true)
    expect(Percentile.quantile(Percentile.histogram([10, 20, 30, 40]), 0.5)).toBeCloseTo(25, -0.1)
    expect(Number.isNaN(Percentile.quantile(new Map(), 0.5))).toBe(true)
  })
})
