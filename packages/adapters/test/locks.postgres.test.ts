import { describe, expect, it } from "@effect/vitest"
import { Config, Findings, Operations, Store } from "@scanfleet/core"
import { Effect, Layer, Redacted } from "effect"
import { inject } from "vitest"
import * as PgStore from "../src/PgStore.js"
import { schema } from "./support/PgSchema.js"

// A revocation takes a table lock on assignments, then its device's row locks; every other
// transaction that locks a reservation and then updates it (a cancellation, a release, a result
// judged in a transaction, the expiry sweep) must take its writer's table lock first, or the two
// deadlock. PostgreSQL resolves a deadlock after `deadlock_timeout` and the store retries, so
// the answers stay right: with deadlock_timeout at 30 s here, a deadlock shows as a race that
// does not end in time.

const T0 = Date.UTC(2025, 0, 1)

const store = (name: string) => {
  const u = new URL(inject("pgUrl"))
  u.searchParams.set("options", `-c search_path=${name} -c deadlock_timeout=30s`)
  return PgStore.layer({ url: Redacted.make(u.toString()), maxConnections: 8 })
}

describe("PostgreSQL lock order", () => {
  it.scoped(
    "a revocation racing a cancellation, a release, a result with findings and the expiry sweep of its device's reservations never deadlocks (each race ends well within deadlock_timeout)",
    () =>
      Effect.gen(function* () {
        const ctx = yield* Layer.build(store(yield* schema(inject("pgUrl"))))
        const s = ctx.unsafeMap.get(Store.Store.key) as Store.StoreShape
        const o = ctx.unsafeMap.get(Operations.Operations.key) as Operations.OperationsShape
        const actor = { who: "t", why: "race", now: T0 }
        for (let round = 0; round < 12; round++) {
          yield* s.recordObservations(Array.from({ length: 4 }, (_, i) => ({ source: "github" as const, identity: `r${round}/${i}`, remoteAt: T0 - 1 })), T0)
          const d = yield* s.addDevice({ name: `d${round}`, slots: 4, tokenHash: `h${round}`, now: T0 })
          const got = yield* s.claimMany({ deviceId: d.id, slots: [0, 1, 2, 3], now: T0, config: Config.defaults })
          expect(got).toHaveLength(4)
          const [a, b, c, e] = got
          const finding = { scanner: "t", detector: "k", path: "f", line: 1, fingerprint: `hmac-sha256:${"1".repeat(64)}`, preview: "" }
          const racers: ReadonlyArray<Effect.Effect<unknown, unknown>> = [
            o.revokeDevice(d.id, actor),
            o.cancel(a.reservationId, actor),
            s.release({ deviceId: d.id, reservationId: b.reservationId, fence: b.fence, now: T0 + 1 }),
            s.submitResult({ deviceId: d.id, reservationId: c.reservationId, fence: c.fence, now: T0 + 1, outcome: "findings", finalPhase: null, body: JSON.stringify({ findings: [finding], log: "" }) }),
            s.expireDue({ now: e.expiresAt ?? T0 + 10 * 86_400_000, maxAttempts: 5, limit: 10 })
          ]
          yield* Effect.all(racers.map((r) => Effect.either(r)), { concurrency: "unbounded" }).pipe(
            Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error(`round ${round}: a race did not end within 10 s (a deadlock waits deadlock_timeout, 30 s)`) })
          )
          // every reservation of the device ended, whoever won
          expect(Findings.carriesFindings("findings", JSON.stringify({ findings: [finding], log: "" }))).toBe(true)
          const after = yield* Effect.forEach(got, (x) => s.getAssignment(x.reservationId))
          expect(after.map((x) => x?.state)).not.toContain("active")
        }
      }),
    120_000
  )
})
