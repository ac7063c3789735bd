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

// A store on a fresh schema whose statements are captured as sent.
const capturedStore = Effect.gen(function* () {
  const url = urlFor(inject("pgUrl"), yield* schema(inject("pgUrl")))
  const wire = capturing(url)
  const store = yield* Effect.provide(PgStore.make, yield* Layer.build(wire.layer))
  return { url, wire, store }
})

describe("postgres query plans use the partial indexes made for them", () => {
  it.live("claim, promotion and expiry each use their index (plans are printed)", () =>
    Effect.gen(function* () {
      const { url, wire, store } = yield* capturedStore
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

  it.live("the merged claim's generic plan scans the claim index, and a claim of one target locks one target, not the inner LIMIT's 64", () =>
    Effect.gen(function* () {
      const { url, wire, store } = yield* capturedStore
      // A queue of 60,000. The claim's inner LIMIT is a literal, so even the generic plan (the one a
      // prepared statement keeps) is planned for a few rows, not for a tenth of the queue.
      for (let k = 0; k < 6; k++)
        yield* store.recordObservations(Array.from({ length: 10_000 }, (_, i) => ({ source: "github" as const, identity: `q/${k}-${i}`, remoteAt: T0 - DAY })), T0)
      yield* Effect.promise(async () => {
        const c = new pg.Client({ connectionString: url })
        await c.connect()
        await c.query("ANALYZE targets")
        await c.end()
      })
      const device = yield* store.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
      const from = wire.sent.length
      expect(yield* store.claim({ deviceId: device.id, slot: 0, now: T0, config: Config.defaults })).not.toBeNull()
      const claim = find(wire.sent.slice(from), /SET\s+status = 'in_progress'/)
      const [generic, run] = yield* Effect.promise(async () => {
        const c = new pg.Client({ connectionString: url })
        await c.connect()
        try {
          const plan = async (q: string, values?: Array<unknown>) =>
            (await c.query(q, values)).rows.map((r: Record<string, string>) => r["QUERY PLAN"]).join("\n")
          const generic = await plan(`EXPLAIN (GENERIC_PLAN) ${claim.text}`)
          // Run for real (rolled back) to count the rows it locked; the device's slot is taken, so free it first.
          await c.query("BEGIN")
          await c.query("UPDATE assignments SET state = 'completed'")
          const run = await plan(`EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) ${claim.text}`, claim.values as Array<unknown>)
          await c.query("ROLLBACK")
          return [generic, run] as const
        } finally {
          await c.end()
        }
      })
      console.log(`merged claim, generic plan:\n${generic}\n\nrun:\n${run}`)
      expect(generic).toContain("targets_claim_idx")
      expect(generic).not.toMatch(/Seq Scan on targets/)
      expect(run).toMatch(/LockRows \(actual rows=1(\.00)? loops=1\)/)
    }).pipe(Effect.scoped), 60_000)
})
