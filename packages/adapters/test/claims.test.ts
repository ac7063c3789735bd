import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { inject } from "vitest"
import { Config, type Assignment } from "@scanfleet/core"
import * as PgStore from "../src/PgStore.js"
import { capturing } from "./support/PgCapture.js"
import { schema, urlFor } from "./support/PgSchema.js"

const T0 = Date.UTC(2025, 0, 1)
const config = Config.defaults

describe("claims and batches of results on PostgreSQL are one statement when they succeed", () => {
  it.live("a claim, a batch claim of 64 slots and a batch of 64 results each take one round trip, and concurrent claims or results of one device's 8 slots merge into at most two", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const wire = capturing(urlFor(inject("pgUrl"), name), 10)
      const store = yield* Effect.provide(PgStore.make, yield* Layer.build(wire.layer))
      yield* store.recordObservations(Array.from({ length: 200 }, (_, i) => ({ source: "github" as const, identity: `c/${i}`, remoteAt: null })), T0)
      const [single, batch, shared] = yield* Effect.forEach([1, 64, 8], (slots, i) => store.addDevice({ name: `d${i}`, slots, tokenHash: `h${i}`, now: T0 }))
      const trips = <A, E>(self: Effect.Effect<A, E>) =>
        Effect.gen(function* () {
          const from = wire.sent.length
          const value = yield* self
          return { value, trips: wire.sent.length - from }
        })
      const finish = (a: Assignment.Assignment) =>
        store.submitResult({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: T0 + 1, outcome: "clean", finalPhase: null, body: "{}" })

      // A store's first claim under a configuration interns its policies before (once per store and
      // configuration object: an insert of any missing rows, then a read of their ids).
      const first = yield* trips(store.claim({ deviceId: single.id, slot: 0, now: T0, config }))
      expect(first.value?.identity).toBe("c/0")
      expect(first.trips).toBe(3)
      yield* finish(first.value!)
      const one = yield* trips(store.claim({ deviceId: single.id, slot: 0, now: T0, config }))
      expect(one.value?.identity).toBe("c/1")
      expect(one.trips).toBe(1)
      // The same policies in another configuration object (a server reads its configuration afresh per claim) intern nothing again.
      yield* finish(one.value!)
      const again = yield* trips(store.claim({ deviceId: single.id, slot: 0, now: T0, config: JSON.parse(JSON.stringify(config)) as Config.ManagedConfig }))
      expect(again.value?.identity).toBe("c/2")
      expect(again.trips).toBe(1)

      const many = yield* trips(store.claimMany({ deviceId: batch.id, slots: Array.from({ length: 64 }, (_, i) => 63 - i), now: T0, config }))
      expect(many.value.map((a) => a.identity)).toEqual(Array.from({ length: 64 }, (_, i) => `c/${i + 3}`))
      expect(many.value.map((a) => a.slot)).toEqual(Array.from({ length: 64 }, (_, i) => 63 - i))
      expect(many.trips).toBe(1)
      const done = yield* trips(
        store.submitResults(many.value.map((a) => ({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: T0 + 1, outcome: "clean", finalPhase: null, body: "{}" })))
      )
      expect(done.value.every((r) => r._tag === "Right")).toBe(true)
      expect(done.trips).toBe(1)

      // The slots of one device claim at once, round after round: the first call goes out at once
      // (nothing waits on an idle store) and the calls made while it is in flight follow as one.
      for (let round = 0; round < 5; round++) {
        const got = yield* trips(Effect.all([0, 1, 2, 3, 4, 5, 6, 7].map((slot) => store.claim({ deviceId: shared.id, slot, now: T0, config })), { concurrency: "unbounded" }))
        expect(got.value.map((a) => a?.slot)).toEqual([0, 1, 2, 3, 4, 5, 6, 7])
        expect(got.trips).toBeLessThanOrEqual(2)
        const ended = yield* trips(Effect.all(got.value.map((a) => finish(a!)), { concurrency: "unbounded" }))
        expect(ended.value.map((r) => r.reservationId)).toEqual(got.value.map((a) => a!.reservationId))
        expect(ended.trips).toBeLessThanOrEqual(2)
      }
    }).pipe(Effect.scoped), 60_000)
})
