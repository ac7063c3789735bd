import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { inject } from "vitest"
import { Config } from "@scanfleet/core"
import * as PgStore from "../src/PgStore.js"
import { schema, urlFor } from "./support/PgSchema.js"

const T0 = Date.UTC(2025, 0, 1)

describe("durations folded off the hot path on PostgreSQL", () => {
  it.live("accepted results leave their reservations in duration_pending and no duration row; the expiry sweep folds them into durations and rollups, and percentiles count every result", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const ctx = yield* Layer.build(PgStore.clientLayer({ url: Redacted.make(urlFor(inject("pgUrl"), name)), maxConnections: 2 }))
      const store = yield* Effect.provide(PgStore.make, ctx)
      const sql = yield* Effect.provide(SqlClient.SqlClient, ctx)
      const count = (table: string) => Effect.map(sql<{ n: number }>`SELECT count(*)::int AS n FROM ${sql(table)}`, ([r]) => r.n)
      yield* store.recordObservations(Array.from({ length: 5 }, (_, i) => ({ source: "github" as const, identity: `d/${i}`, remoteAt: null })), T0)
      const d = yield* store.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
      for (let i = 0; i < 5; i++) {
        const a = yield* store.claim({ deviceId: d.id, slot: 0, now: T0 + i * 1000, config: Config.defaults })
        yield* store.submitResult({ deviceId: d.id, reservationId: a!.reservationId, fence: a!.fence, now: T0 + i * 1000 + 500, outcome: "clean", finalPhase: null, body: "{}" })
      }
      expect([yield* count("duration_pending"), yield* count("durations"), yield* count("duration_rollup_deltas")]).toEqual([5, 0, 0])
      expect(yield* store.expireDue({ now: T0 + 10_000, maxAttempts: 3, limit: 10 })).toEqual([])
      expect([yield* count("duration_pending"), yield* count("durations"), yield* count("duration_rollup_deltas")]).toEqual([0, 5, 0])
      expect(yield* count("duration_rollups")).toBeGreaterThan(0)
      const rows = yield* store.percentiles({ from: T0, to: T0 + 60_000, source: "github", metric: "end_to_end", minSamples: 1 })
      expect(rows.map((r) => [r.count, r.p50.status === "ok" && Math.abs(r.p50.value - 500) <= 500 * 0.01])).toEqual([[5, true]])
    }).pipe(Effect.scoped), 60_000)

  it.live("a percentile read folds what is pending first, so it counts every result accepted before it", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const ctx = yield* Layer.build(PgStore.clientLayer({ url: Redacted.make(urlFor(inject("pgUrl"), name)), maxConnections: 4 }))
      const store = yield* Effect.provide(PgStore.make, ctx)
      yield* store.recordObservations(Array.from({ length: 30 }, (_, i) => ({ source: "gitlab" as const, identity: `p/${i}`, remoteAt: null })), T0)
      const d = yield* store.addDevice({ name: "d", slots: 3, tokenHash: "h", now: T0 })
      const got = yield* store.claimMany({ deviceId: d.id, slots: [0, 1, 2], now: T0, config: Config.defaults })
      yield* store.submitResults(got.map((a, i) => ({ deviceId: d.id, reservationId: a.reservationId, fence: a.fence, now: T0 + 100 * (i + 1), outcome: "findings" as const, finalPhase: null, body: "{}" })))
      const rows = yield* store.percentiles({ from: T0, to: T0 + 60_000, source: "gitlab", metric: "end_to_end", minSamples: 1 })
      expect(rows.map((r) => [r.outcome, r.count])).toEqual([["findings", 3]])
    }).pipe(Effect.scoped), 60_000)
})
