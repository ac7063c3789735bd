import { describe, expect, it } from "@effect/vitest"
import { FastCheck as fc } from "effect"
import { Discovery } from "@scanfleet/core"

const limits = fc.record({ maxPages: fc.integer({ min: 1, max: 20 }), maxResults: fc.integer({ min: 1, max: 500 }) })
const state = fc.record({
  pagesFetched: fc.nat({ max: 30 }),
  resultsSeen: fc.nat({ max: 700 }),
  pageAllKnown: fc.boolean(),
  hasNext: fc.boolean(),
  updatedRescans: fc.boolean()
})

/** A listing: page sizes and, per page, whether every identity on it was already known. */
const listing = fc.array(fc.record({ size: fc.integer({ min: 0, max: 100 }), allKnown: fc.boolean() }), { minLength: 1, maxLength: 40 })

/** Walks a listing the way a discovery cycle does, asking the policy after each page. */
const walk = (pages: ReadonlyArray<{ size: number; allKnown: boolean }>, l: Discovery.Limits, updatedRescans: boolean) => {
  let fetched = 0, seen = 0
  for (;;) {
    const page = pages[fetched]
    fetched++
    seen += page.size
    const step = Discovery.nextStep({ pagesFetched: fetched, resultsSeen: seen, pageAllKnown: page.allKnown, hasNext: fetched < pages.length, updatedRescans }, l)
    if (step._tag === "stop") return { fetched, seen, reason: step.reason }
  }
}

describe("Discovery paging policy", () => {
  it.prop("the hard page and result limits always stop discovery", [state, limits], ([s, l]) => {
    const step = Discovery.nextStep(s, l)
    if (s.pagesFetched >= l.maxPages || s.resultsSeen >= l.maxResults || !s.hasNext) expect(step._tag).toBe("stop")
  })

  it.prop("a page of known identities never stops discovery while updated rescans are on", [state, limits], ([s, l]) => {
    const step = Discovery.nextStep({ ...s, updatedRescans: true, pageAllKnown: true }, l)
    if (step._tag === "stop") expect(step.reason).not.toBe("known_page")
    // Knowing the page makes no difference at all with updated rescans on.
    expect(step).toEqual(Discovery.nextStep({ ...s, updatedRescans: true, pageAllKnown: false }, l))
  })

  it.prop("without updated rescans a page of known identities stops discovery", [state, limits], ([s, l]) => {
    const step = Discovery.nextStep({ ...s, updatedRescans: false, pageAllKnown: true }, l)
    expect(step._tag).toBe("stop")
  })

  it.prop("a cycle fetches at most its page limit and stops at the first page that reaches the result limit", [listing, limits, fc.boolean()], ([pages, l, rescans]) => {
    const r = walk(pages, l, rescans)
    expect(r.fetched).toBeLessThanOrEqual(l.maxPages)
    // Only the page that crossed the result limit may overshoot it.
    expect(r.seen - pages[r.fetched - 1].size).toBeLessThan(l.maxResults)
    if (rescans) expect(r.reason).not.toBe("known_page")
    if (rescans && r.reason === "end_of_listing") expect(r.fetched).toBe(pages.length)
  })

  it.prop(
    "cycle counts never overlap",
    [fc.uniqueArray(fc.string({ maxLength: 3 }), { maxLength: 20 }), fc.uniqueArray(fc.string({ maxLength: 3 }), { maxLength: 20 })],
    ([inserted, promoted]) => {
      const ins = new Set(inserted), pro = new Set(promoted)
      const c = Discovery.counts(ins, pro)
      const union = new Set([...inserted, ...promoted])
      expect(c.queuedNewCount).toBe(ins.size)
      expect(c.queuedNewCount + c.queuedUpdatedCount).toBe(union.size)
      expect(c.queuedUpdatedCount).toBe(promoted.filter((p) => !ins.has(p)).length)
    }
  )
})
