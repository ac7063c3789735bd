import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { inject } from "vitest"
import { Config } from "@scanfleet/core"
import * as PgStore from "../src/PgStore.js"
import { schema, urlFor } from "./support/PgSchema.js"

const T0 = Date.UTC(2025, 0, 1)

describe("percentile deltas on PostgreSQL", () => {
  it.live("results leave counts in duration_rollup_deltas; the expiry sweep folds them into the rollups, and percentiles still count every result", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const ctx = yield* Layer.build(PgStore.clientLayer({ url: Redacted.make(urlFor(inject("pgUrl"), name)), maxConnections: 2 }))
      const store = yield* Effect.provide(PgStore.make, ctx)
      const sql = yield* Effect.provide(SqlClient.SqlClient, ctx)
      const deltas = Effect.map(sql<{ n: number }>`SELECT count(*)::int AS n FROM duration_rollup_deltas`, ([r]) => r.n)
      yield* store.recordObservations(Array.from({ length: 5 }, (_, i) => ({ source: "github" as const, identity: `d/${i}`, remoteAt: null })), T0)
      const d = yield* store.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
      for (let i = 0; i < 5; i++) {
        const a = yield* store.claim({ deviceId: d.id, slot: 0, now: T0 + i * 1000, config: Config.defaults })
        yield* store.submitResult({ deviceId: d.id, reservationId: a!.reservationId, fence: a!.fence, now: T0 + i * 1000 + 500, outcome: "clean", finalPhase: null, body: "{}" })
      }
      expect(yield* deltas).toBeGreaterThan(0)
      expect(yield* store.expireDue({ now: T0 + 10_000, maxAttempts: 3, limit: 10 })).toEqual([])
      expect(yield* deltas).toBe(0)
      const rows = yield* store.percentiles({ from: T0, to: T0 + 60_000, source: "github", metric: "end_to_end", minSamples: 1 })
      expect(rows.map((r) => r.count)).toEqual([5])
    }).pipe(Effect.scoped), 60_000)
})
