import { describe, expect, it } from "@effect/vitest"
import { FastCheck as fc } from "effect"
import { Priority } from "@scanfleet/core"

const priority = fc.integer({ min: Priority.min, max: Priority.max })
const id = fc.integer({ min: 1, max: 2 ** 40 })
const entry = fc.record({ id, priority })

// The claim order of a pending set: what every store's claim takes first, then second, ...
const claimOrder = <T extends { id: number; priority: number }>(xs: ReadonlyArray<T>) => [...xs].sort(Priority.compare)

describe("Priority: the claim order", () => {
  it.prop(
    "starvation-free: a pending target is claimed before every target discovered more than overtakeBound ids after it, whatever priorities either has",
    [entry, fc.integer({ min: 1, max: 2 ** 30 }), priority],
    ([old, gap, p]) => {
      const newer = { id: old.id + Priority.overtakeBound + gap, priority: p }
      expect(Priority.compare(old, newer)).toBeLessThan(0)
    }
  )

  it.prop(
    "starvation-free under a stream: however many later targets arrive with any priorities while claims go on, a target waits for at most overtakeBound of them",
    [entry, fc.array(fc.tuple(fc.integer({ min: 1, max: 3 * Priority.step }), priority), { minLength: 1, maxLength: 300 })],
    ([watched, arrivals]) => {
      // arrivals get increasing ids after the watched target; one claim per arrival takes the head of the claim order
      let next = watched.id
      let pending = [watched]
      let overtakenBy = 0
      for (const [gap, p] of arrivals) {
        next += gap
        pending.push({ id: next, priority: p })
        const [head, ...rest] = claimOrder(pending)
        pending = rest
        if (head === watched) break
        if (head.id > watched.id) overtakenBy = Math.max(overtakenBy, head.id - watched.id)
      }
      expect(overtakenBy).toBeLessThanOrEqual(Priority.overtakeBound)
    }
  )

  it.prop(
    "at equal priority claims keep id order (the default order of a fleet that never sets one)",
    [id, id, priority],
    ([a, b, p]) => {
      fc.pre(a !== b)
      expect(Math.sign(Priority.compare({ id: a, priority: p }, { id: b, priority: p }))).toBe(Math.sign(a - b))
    }
  )

  it.prop(
    "a higher priority goes first among targets fewer than step ids apart",
    [id, fc.integer({ min: -(Priority.step - 1), max: Priority.step - 1 }), priority, priority],
    ([a, offset, p, q]) => {
      fc.pre(p !== q && a + offset >= 1)
      const x = { id: a, priority: p }
      const y = { id: a + offset, priority: q }
      expect(Priority.compare(x, y) < 0).toBe(p > q)
    }
  )

  it.prop("the claim order has no ties: two distinct targets never compare equal", [entry, entry], ([a, b]) => {
    fc.pre(a.id !== b.id)
    expect(Priority.compare(a, b)).not.toBe(0)
  })

  it("the range and the bound are what the documentation states", () => {
    expect([Priority.min, Priority.max, Priority.step, Priority.overtakeBound]).toEqual([-100, 100, 10_000, 2_000_000])
    expect(Priority.PrioritySchema.safeParse(101).success).toBe(false)
    expect(Priority.PrioritySchema.safeParse(1.5).success).toBe(false)
    expect(Priority.PrioritySchema.safeParse(-100).success).toBe(true)
    expect(Priority.claimKeySql("c")).toBe("c.id - c.priority * 10000")
  })
})
