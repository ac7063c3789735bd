import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, FastCheck as fc } from "effect"
import { Claim, Config, MemoryStore, type Store } from "@scanfleet/core"
import { T0 } from "./fixtures/arbitraries.js"

const run = <A, E>(e: Effect.Effect<A, E>): Either.Either<A, E> => Effect.runSync(Effect.either(e))
const config = Config.defaults

describe("Claim.refuseSlots", () => {
  it.prop(
    "a batch of slots the rule admits is distinct, within range and free, so a device never holds more reservations than slots",
    [
      fc.integer({ min: 0, max: 6 }).chain((n) =>
        fc.tuple(fc.constant(n), fc.shuffledSubarray(Array.from({ length: n }, (_, i) => i)), fc.array(fc.integer({ min: -1, max: 7 }), { maxLength: 8 }))
      )
    ],
    ([[slots, busy, requested]]) => {
      const refused = Claim.refuseSlots(slots, busy.map((slot) => ({ slot, reservationId: 100 + slot, fence: 7 })), requested)
      const firstBad = requested.findIndex((s, i) => s < 0 || s >= slots || busy.includes(s) || requested.indexOf(s) < i)
      if (refused === undefined) {
        expect(firstBad).toBe(-1)
        expect(busy.length + requested.length).toBeLessThanOrEqual(slots)
      } else {
        expect(firstBad).toBeGreaterThanOrEqual(0)
        const s = requested[firstBad]
        expect(refused.reason).toBe(s < 0 || s >= slots ? "capacity" : "slot_busy")
        // a slot an active reservation holds names it; a slot listed twice names none
        expect(refused.holder).toEqual(busy.includes(s) ? { reservationId: 100 + s, fence: 7 } : undefined)
      }
    }
  )
})

describe("MemoryStore.claimMany", () => {
  // Two identical stores: one takes the batch, the other the same slots one claim at a time.
  const setup = (pending: number, held: ReadonlyArray<number>) => {
    const s: Store.StoreShape = MemoryStore.make()
    const d = Either.getOrThrow(run(s.addDevice({ name: "d", slots: 5, tokenHash: "h", now: T0 })))
    run(s.recordObservations(Array.from({ length: pending + held.length }, (_, i) => ({ source: i % 2 ? "github" : "gitlab", identity: `t${i}`, remoteAt: null })), T0))
    for (const slot of held) run(s.claim({ deviceId: d.id, slot, now: T0, config }))
    return { s, d }
  }
  const state = (s: Store.StoreShape) => ({
    assignments: Either.getOrThrow(run(s.listAssignments({ limit: 100 }))),
    counts: Either.getOrThrow(run(s.countTargets()))
  })

  it.prop(
    "a batch claim leaves the state successive single claims of its slots leave, or is refused with their first refusal and changes nothing",
    [
      fc.integer({ min: 0, max: 6 }),
      fc.shuffledSubarray([0, 1, 2, 3, 4]),
      fc.shuffledSubarray([-1, 0, 1, 2, 3, 4, 5]),
      fc.option(fc.integer({ min: 0, max: 3 }), { nil: undefined })
    ],
    ([pending, held, slots, sourceCap]) => {
      const batch = setup(pending, held)
      const single = setup(pending, held)
      const before = state(batch.s)
      const got = run(batch.s.claimMany({ deviceId: batch.d.id, slots, now: T0 + 1, config, sourceCap }))
      const one = slots.map((slot) => run(single.s.claim({ deviceId: single.d.id, slot, now: T0 + 1, config, sourceCap })))
      const firstRefusal = one.find(Either.isLeft)
      if (Either.isRight(got)) {
        expect(firstRefusal).toBeUndefined()
        expect(got.right).toEqual(one.flatMap((r) => (Either.isRight(r) && r.right !== null ? [r.right] : [])))
        expect(state(batch.s)).toEqual(state(single.s))
      } else {
        expect(firstRefusal && firstRefusal.left.reason).toBe(got.left.reason)
        expect(state(batch.s)).toEqual(before)
      }
    }
  )
})
