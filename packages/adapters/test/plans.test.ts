import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import pg from "pg"
import { inject } from "vitest"
import { Config } from "@scanfleet/core"
import * as PgStore from "../src/PgStore.js"
import { capturing, type Sent } from "./support/PgCapture.js"
import { schema, urlFor } from "./support/PgSchema.js"

const T0 = Date.UTC(2025, 0, 1)
const DAY = 86_400_000

// Explains a statement exactly as the store sent it (same text, same parameters).
const explain = (url: string, q: Sent, settings: string) =>
  Effect.promise(async () => {
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    try {
      await client.query(settings)
      const { rows } = await client.query(`EXPLAIN ${q.text}`, q.values as Array<unknown>)
      return rows.map((r: Record<string, string>) => r["QUERY PLAN"]).join("\n")
    } finally {
      await client.end()
    }
  })

const find = (sent: ReadonlyArray<Sent>, pattern: RegExp) => {
  const q = sent.find((s) => pattern.test(s.text))
  if (!q) throw new Error(`no statement matching ${pattern} was sent`)
  return q
}

describe("postgres query plans use the partial indexes made for them", () => {
  it.live("claim, promotion and expiry each use their index (plans are printed)", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const url = urlFor(inject("pgUrl"), name)
      const wire = capturing(url)
      const store = yield* Effect.provide(PgStore.make, yield* Layer.build(wire.layer))
      // a realistic shape: 50,000 targets, 1% pending, the rest completed and half of those changed since
      yield* store.recordObservations(Array.from({ length: 50_000 }, (_, i) => ({ source: i % 2 ? "github" : "gitlab", identity: `t/${i}`, remoteAt: T0 - DAY })), T0)
      yield* Effect.promise(async () => {
        const c = new pg.Client({ connectionString: url })
        await c.connect()
        await c.query(`UPDATE targets SET status = 'completed', completed_at = ${T0}, covered_remote_at = ${T0 - DAY},
          last_scan_started_at = ${T0} - id, observed_remote_at = CASE WHEN id % 2 = 0 THEN ${T0} ELSE observed_remote_at END WHERE id % 100 <> 0`)
        await c.query("ANALYZE")
        await c.end()
      })
      const device = yield* store.addDevice({ name: "d", slots: 2, tokenHash: "h", now: T0 })
      const from = wire.sent.length
      yield* store.claim({ deviceId: device.id, slot: 0, now: T0 + DAY, config: Config.defaults })
      yield* store.promote("github", { budget: 10, cooldownMs: 0 }, T0 + 2 * DAY)
      yield* store.expireDue({ now: T0 + 3 * DAY, maxAttempts: 3, limit: 10 })
      const sent = wire.sent.slice(from)

      const claim = yield* explain(url, find(sent, /SET\s+status = 'in_progress'/), "SELECT 1")
      const promote = yield* explain(url, find(sent, /WITH picked AS/), "SELECT 1")
      // the assignments table holds one row here: forbid sequential scans to show the index serves the sweep
      const expire = yield* explain(url, find(sent, /FROM assignments WHERE state = 'active' AND expires_at <=/), "SET enable_seqscan = off")
      console.log(`claim:\n${claim}\n\npromotion:\n${promote}\n\nexpiry sweep:\n${expire}`)
      expect(claim).toContain("targets_claim_idx")
      expect(claim).toContain("LockRows")
      expect(promote).toContain("targets_promotion_idx")
      expect(expire).toContain("assignments_active_expiry_idx")
    }).pipe(Effect.scoped), 60_000)
})
