import { MemoryStore, Store } from "@scanfleet/core"
import { Effect, Layer, TestClock, TestContext } from "effect"
import { describe, expect, it } from "vitest"
import * as AdminRoutes from "../src/AdminRoutes.js"

// The percentile answer's window is the last windowHours exactly: a duration that ended
// windowHours ago to the millisecond is outside it, one a millisecond later and one now are in.

const T = Date.UTC(2025, 6, 1, 12, 0, 0)

describe("the percentile window", () => {
  it("holds exactly windowHours: what ended after `from` and up to `to`, both ends as the answer states them", async () => {
    const hour = 3_600_000
    const ended = [T - hour - 1, T - hour, T - hour + 1, T - 1, T]
    const answer = await Effect.runPromise(
      Effect.gen(function* () {
        yield* TestClock.setTime(T)
        const store = yield* Store.Store
        yield* store.recordDurations(ended.map((at) => ({ source: "github" as const, metric: "end_to_end" as const, outcome: "clean" as const, ms: 1000, at })))
        return yield* AdminRoutes.percentileData({ windowHours: 1, metric: "end_to_end" })
      }).pipe(Effect.provide(Layer.merge(Layer.succeed(Store.Store, MemoryStore.make()), TestContext.TestContext)))
    )
    expect(answer.to - answer.from).toBe(hour)
    expect(answer.to).toBe(T)
    expect(answer.rows.map((r) => r.p50)).toEqual([{ status: "insufficient", count: 3, required: expect.any(Number) }])
  })
})
