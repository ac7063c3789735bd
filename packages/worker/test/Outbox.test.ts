import { Outbox } from "@scanfleet/worker"
import { Chunk, Duration, Effect, Schedule } from "effect"
import { describe, expect, it } from "vitest"

describe("the outbox's retry schedule", () => {
  it("each delay is the capped exponential step, jittered to between half and all of it, and it never gives up", async () => {
    for (const [min, max] of [[100, 5000], [50, 200], [200, 5000]] as const) {
      const delays = Chunk.toReadonlyArray(await Effect.runPromise(Schedule.run(Schedule.delays(Outbox.backoff(min, max)), 0, Array.from({ length: 40 }, (_, i) => i))))
      expect(delays).toHaveLength(40)
      delays.forEach((d, n) => {
        const step = Math.min(max, min * 2 ** n)
        expect(Duration.toMillis(d)).toBeGreaterThanOrEqual(step * 0.5)
        expect(Duration.toMillis(d)).toBeLessThanOrEqual(step)
      })
      // Jittered: a fleet of devices does not retry in step.
      expect(new Set(delays.slice(-10).map((d) => Duration.toMillis(d))).size).toBeGreaterThan(1)
    }
  })
})
