import { Config, Store } from "@scanfleet/core"
import { Effect, Layer, ManagedRuntime } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import * as Database from "../src/Database.js"
import * as Metrics from "../src/Metrics.js"
import { sqliteFile } from "./fixtures/Databases.js"

// The counters of accepted results, over a SQLite file: a resubmission returns the original
// receipt, and is not a second result, whatever millisecond it arrives in.

const db = sqliteFile()
afterAll(() => db.cleanup())
const T0 = Date.UTC(2025, 0, 1)

const count = (text: string, name: string) =>
  text
    .split("\n")
    .filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `))
    .reduce((n, l) => n + Number(l.slice(l.lastIndexOf(" ") + 1)), 0)

describe("/metrics counts of accepted results", () => {
  it("a result resubmitted in the same millisecond, alone or in a batch, counts once in scanfleet_results_total and the duration histogram", async () => {
    const rt = ManagedRuntime.make(Metrics.layer.pipe(Layer.provideMerge(Database.layer(db.url))))
    try {
      const text = await rt.runPromise(
        Effect.gen(function* () {
          const store = yield* Store.Store
          const device = yield* store.addDevice({ name: "m", slots: 3, tokenHash: "m", now: T0 })
          yield* store.recordObservations(["m/a", "m/b", "m/c"].map((identity) => ({ source: "github" as const, identity, remoteAt: null })), T0)
          for (let slot = 0; slot < 3; slot++) {
            const a = yield* store.claim({ deviceId: device.id, slot, now: T0, config: Config.defaults })
            const input = { deviceId: device.id, reservationId: a!.reservationId, fence: a!.fence, now: T0 + 1000, outcome: "clean" as const, finalPhase: null, body: "{}" }
            const first = yield* store.submitResult(input)
            // the same millisecond: one call alone, then a batch of two
            expect(yield* store.submitResult(input)).toEqual(first)
            yield* store.submitResults([input, input])
          }
          return yield* Effect.flatMap(Metrics.Metrics, (m) => m.text)
        })
      )
      expect(count(text, "scanfleet_results_total")).toBe(3)
      expect(count(text, "scanfleet_assignment_duration_seconds_count")).toBe(3)
    } finally {
      await rt.dispose()
    }
  })

  it("a result with its slot's next claim counts the result and the claim, and a repeated pair counts neither again", async () => {
    const other = sqliteFile()
    const rt = ManagedRuntime.make(Metrics.layer.pipe(Layer.provideMerge(Database.layer(other.url))))
    try {
      const text = await rt.runPromise(
        Effect.gen(function* () {
          const store = yield* Store.Store
          const device = yield* store.addDevice({ name: "p", slots: 1, tokenHash: "p", now: T0 })
          yield* store.recordObservations(["p/a", "p/b"].map((identity) => ({ source: "github" as const, identity, remoteAt: null })), T0)
          const a = yield* store.claim({ deviceId: device.id, slot: 0, now: T0, config: Config.defaults })
          const input = { deviceId: device.id, reservationId: a!.reservationId, fence: a!.fence, now: T0 + 1000, outcome: "clean" as const, finalPhase: null, body: "{}" }
          const pair = yield* store.submitResultAndClaim(input, { slot: 0, config: Config.defaults })
          expect(pair.next).not.toBeNull()
          // the same pair again: the receipt repeats and the slot is held by the claim just made
          expect(yield* store.submitResultAndClaim(input, { slot: 0, config: Config.defaults })).toMatchObject({ next: null, claimRefused: { reason: "slot_busy" } })
          return yield* Effect.flatMap(Metrics.Metrics, (m) => m.text)
        })
      )
      expect(count(text, "scanfleet_results_total")).toBe(1)
      expect(count(text, "scanfleet_assignment_duration_seconds_count")).toBe(1)
      expect(count(text, "scanfleet_claims_total")).toBe(2)
    } finally {
      await rt.dispose()
      other.cleanup()
    }
  })
})
