import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Layer } from "effect"
import pg from "pg"
import { inject } from "vitest"
import { Config } from "@scanfleet/core"
import * as PgStore from "../src/PgStore.js"
import { capturing } from "./support/PgCapture.js"
import { pickPlan } from "./support/PgPick.js"
import { schema, urlFor } from "./support/PgSchema.js"

// Where a PostgreSQL claim's index scan starts (migration 0013): the sweep raises it over the
// entries claimed targets leave at the head of targets_claim_idx; any write that makes a target
// pending lowers it to that target's key.

const T0 = Date.UTC(2025, 0, 1)
const MIN = 60_000

const withClient = <A>(url: string, f: (c: pg.Client) => Promise<A>) =>
  Effect.promise(async () => {
    const c = new pg.Client({ connectionString: url })
    await c.connect()
    try {
      return await f(c)
    } finally {
      await c.end()
    }
  })

const head = (url: string) => withClient(url, async (c) => (await c.query("SELECT key::float8 AS key, epoch::float8 AS epoch FROM claim_head")).rows[0] as { key: number; epoch: number })

// A store on a fresh schema whose statements are captured, with `n` pending targets and autovacuum
// off for targets (so only the head can spare a claim the claimed entries).
const queue = (n: number, analyse = true) =>
  Effect.gen(function* () {
    const url = urlFor(inject("pgUrl"), yield* schema(inject("pgUrl")))
    const wire = capturing(url)
    const store = yield* Effect.provide(PgStore.make, yield* Layer.build(wire.layer))
    yield* withClient(url, (c) => c.query("ALTER TABLE targets SET (autovacuum_enabled = off)"))
    for (let k = 0; k < n; k += 5_000)
      yield* store.recordObservations(Array.from({ length: Math.min(5_000, n - k) }, (_, i) => ({ source: "github" as const, identity: `h/${k + i}`, remoteAt: T0 - MIN })), T0)
    if (analyse) yield* withClient(url, (c) => c.query("ANALYZE targets"))
    const device = yield* store.addDevice({ name: "d", slots: 64, tokenHash: "h", now: T0 })
    const slots = Array.from({ length: 64 }, (_, s) => s)
    // Claims `rounds` batches of 64 and completes them.
    const work = (rounds: number, now: number) =>
      Effect.forEach(Array.from({ length: rounds }), () =>
        Effect.flatMap(store.claimMany({ deviceId: device.id, slots, now, config: Config.defaults }), (got) =>
          store.submitResults(got.map((a) => ({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: now + 1, outcome: "clean" as const, finalPhase: null, body: "{}" })))
        ), { discard: true })
    const sweep = (now: number) => store.expireDue({ now, maxAttempts: 5, limit: 100 })
    return { url, wire, store, device, work, sweep }
  })

// The buffers a pick of 64 reads in the claim index (the index and the rows it locks), run for real.
const pickBuffers = (url: string) =>
  Effect.map(pickPlan(url, "ANALYZE, BUFFERS, TIMING OFF, COSTS OFF", [["github"], 64]), (plan) => {
    const lines = plan.split("\n")
    const scan = lines.findIndex((l) => l.includes("targets_claim_idx"))
    expect(scan, plan).toBeGreaterThan(0)
    return Number(/hit=(\d+)/.exec(lines.slice(scan).find((l) => l.includes("Buffers:")) ?? "")?.[1] ?? Number.NaN)
  })

describe("postgres claim head", () => {
  for (const [analyse, what] of [
    [true, "an analysed queue"],
    [false, "a queue never analysed (the pick's plan does not depend on statistics)"]
  ] as const)
    it.live(`after a sweep a claim skips the index entries of the targets claimed before it: 20,000 claimed, no vacuum, ${what}`, () =>
      Effect.gen(function* () {
        const { url, wire, work, sweep } = yield* queue(30_000, analyse)
        const from = wire.sent.length
        yield* work(1, T0)
        expect(wire.sent.slice(from).some((s) => s.text.includes("scanfleet_claimable("))).toBe(true)
        // what a pick of 64 reads with next to nothing claimed before it
        const fresh = yield* pickBuffers(url)
        yield* work(20_000 / 64, T0)
        const before = yield* pickBuffers(url)
        yield* sweep(T0 + 1)
        const after = yield* pickBuffers(url)
        console.log(`${what}: a claim of 64 picks with ${fresh} buffers at the start, ${before} after 20,000 claims, ${after} after the sweep`)
        // 20,000 dead entries are some 60 leaf pages more for a scan from the index's head (a plan
        // that sorted the queue would read no claim index and fail the search for it above)
        expect(before).toBeGreaterThan(fresh + 40)
        expect(after).toBeLessThanOrEqual(fresh + 5)
      }).pipe(Effect.scoped), 120_000)

  it.live("a target made pending below the head is claimed in its order: expired, re-prioritised and newly discovered", () =>
    Effect.gen(function* () {
      const { url, store, device, work, sweep } = yield* queue(1_000)
      // a reservation that will expire, taken first (lowest key) by a second device, then 256 claimed and completed
      const other = yield* store.addDevice({ name: "other", slots: 1, tokenHash: "o", now: T0 })
      const early = yield* store.claim({ deviceId: other.id, slot: 0, now: T0, config: Config.defaults })
      yield* work(4, T0 + 1)
      yield* sweep(T0 + 2)
      const raised = yield* head(url)
      expect(raised.key).toBeGreaterThan(early!.targetId)

      // expiry makes the first target pending again, below the head: the next claim takes it
      const expired = yield* store.expireDue({ now: early!.expiresAt + 1, maxAttempts: 5, limit: 100 })
      expect(expired.map((a) => a.reservationId)).toEqual([early!.reservationId])
      expect((yield* head(url)).key).toBeLessThanOrEqual(early!.targetId)
      const next = yield* store.claim({ deviceId: other.id, slot: 0, now: early!.expiresAt + 2, config: Config.defaults })
      expect(next!.targetId).toBe(early!.targetId)

      // a pending target raised to the top priority, and a new target of high priority: both first
      yield* sweep(early!.expiresAt + 3)
      const last = yield* withClient(url, async (c) => {
        const r = await c.query("UPDATE targets SET priority = 100 WHERE id = (SELECT max(id) FROM targets) RETURNING id::float8 AS id")
        return Number(r.rows[0].id)
      })
      yield* store.recordObservations([{ source: "gitlab", identity: "fresh", remoteAt: T0 }], T0)
      const fresh = yield* withClient(url, async (c) => {
        const r = await c.query("UPDATE targets SET priority = 99 WHERE identity = 'fresh' RETURNING id::float8 AS id")
        return Number(r.rows[0].id)
      })
      const [a, b] = yield* store.claimMany({ deviceId: device.id, slots: [0, 1], now: early!.expiresAt + 4, config: Config.defaults })
      expect([a.targetId, b.targetId]).toEqual([last, fresh])
    }).pipe(Effect.scoped), 120_000)

  it.live("a claim under a per-source cap picks from the head as well: a target made pending below the head is its next, and a source at its cap is passed over", () =>
    Effect.gen(function* () {
      const { url, wire, store, work, sweep } = yield* queue(1_000)
      const other = yield* store.addDevice({ name: "other", slots: 2, tokenHash: "o", now: T0 })
      const early = yield* store.claim({ deviceId: other.id, slot: 0, now: T0, config: Config.defaults })
      yield* work(4, T0 + 1)
      yield* store.recordObservations([{ source: "gitlab", identity: "late", remoteAt: T0 }], T0 + 1)
      yield* sweep(T0 + 2)
      expect((yield* head(url)).key).toBeGreaterThan(early!.targetId)
      yield* store.expireDue({ now: early!.expiresAt + 1, maxAttempts: 5, limit: 100 })

      const from = wire.sent.length
      const capped = (slot: number, at: number) => store.claim({ deviceId: other.id, slot, now: at, config: Config.defaults, sourceCap: 1 })
      const first = yield* capped(0, early!.expiresAt + 2)
      expect(first!.targetId).toBe(early!.targetId)
      // github now has its one active reservation: the next capped claim passes over every github target
      const second = yield* capped(1, early!.expiresAt + 3)
      expect(second!.source).toBe("gitlab")
      expect(second!.identity).toBe("late")
      expect(wire.sent.slice(from).filter((s) => s.text.includes("scanfleet_claimable(")).length).toBeGreaterThanOrEqual(2)
    }).pipe(Effect.scoped), 120_000)

  it.live("a sweep that reads while a write making a target pending is still open does not raise the head over that target", () =>
    Effect.gen(function* () {
      const { url, store, device, work, sweep } = yield* queue(1_000)
      yield* work(4, T0)
      yield* sweep(T0)
      const low = yield* withClient(url, async (c) => Number((await c.query("SELECT min(id)::float8 AS id FROM targets")).rows[0].id))
      expect((yield* head(url)).key).toBeGreaterThan(low)
      // more claimed, so the next sweep has a higher head to raise to
      yield* work(4, T0)
      // The write: the lowest target made pending again, its transaction left open (it holds the head's row).
      const writer = new pg.Client({ connectionString: url })
      yield* Effect.promise(() => writer.connect())
      yield* Effect.addFinalizer(() => Effect.promise(() => writer.end()))
      yield* Effect.promise(async () => {
        await writer.query("BEGIN")
        await writer.query(`UPDATE targets SET status = 'pending', fence = fence + 1 WHERE id = ${low}`)
      })
      // The sweep's snapshot does not see the write; its raise waits for the head's row, then finds the epoch moved.
      const sweeping = yield* Effect.fork(sweep(T0 + 1))
      yield* Effect.sleep("300 millis")
      yield* Effect.promise(() => writer.query("COMMIT"))
      yield* Fiber.join(sweeping)
      expect((yield* head(url)).key).toBeLessThanOrEqual(low)
      const next = yield* store.claim({ deviceId: device.id, slot: 0, now: T0 + 2, config: Config.defaults })
      expect(next!.targetId).toBe(low)
      // and with nothing open, the next sweep raises it
      yield* sweep(T0 + 3)
      expect((yield* head(url)).key).toBeGreaterThan(low)
    }).pipe(Effect.scoped), 120_000)
})
