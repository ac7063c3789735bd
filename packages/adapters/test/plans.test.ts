import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import pg from "pg"
import { inject } from "vitest"
import { Config, type Store } from "@scanfleet/core"
import * as Rollups from "../src/internal/Rollups.js"
import * as PgStore from "../src/PgStore.js"
import { capturing, type Sent } from "./support/PgCapture.js"
import { pickPlan } from "./support/PgPick.js"
import { schema, urlFor } from "./support/PgSchema.js"

const T0 = Date.UTC(2025, 0, 1)
const DAY = 86_400_000

// Explains a statement exactly as the store sent it (same text, same parameters).
const explain = (url: string, q: Sent, settings: string, options = "") =>
  Effect.promise(async () => {
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    try {
      await client.query(settings)
      const { rows } = await client.query(`EXPLAIN ${options} ${q.text}`, q.values as Array<unknown>)
      return rows.map((r: Record<string, string>) => r["QUERY PLAN"]).join("\n")
    } finally {
      await client.end()
    }
  })

// Runs one statement on its own connection.
const query = (url: string, text: string) =>
  Effect.promise(async () => {
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    try {
      return (await client.query(text)).rows as Array<Record<string, number>>
    } finally {
      await client.end()
    }
  })

// The detail lines (Index Cond, Buffers, ...) of each plan node whose line matches `pattern`.
const nodes = (plan: string, pattern: RegExp): Array<string> => {
  const lines = plan.split("\n")
  const indent = (l: string) => l.length - l.trimStart().length
  return lines.flatMap((l, i) => {
    if (!pattern.test(l)) return []
    const own = indent(l)
    const detail: Array<string> = []
    for (const d of lines.slice(i + 1)) {
      if (indent(d) <= own || d.trimStart().startsWith("->")) break
      detail.push(d.trim())
    }
    return [detail.join("\n")]
  })
}

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

      find(sent, /scanfleet_claimable/)
      const claim = yield* pickPlan(url, "ANALYZE, TIMING OFF, COSTS OFF", [["github", "gitlab", "huggingface", "dockerhub"], 1])
      const promote = yield* explain(url, find(sent, /WITH picked AS/), "SELECT 1")
      // the assignments table holds one row here: forbid sequential scans to show the index serves the sweep
      const expire = yield* explain(url, find(sent, /FROM assignments WHERE state = 'active' AND expires_at <=/), "SET enable_seqscan = off")
      console.log(`claim's pick:\n${claim}\n\npromotion:\n${promote}\n\nexpiry sweep:\n${expire}`)
      expect(claim).toContain("targets_claim_idx")
      expect(claim).toContain("LockRows")
      expect(promote).toContain("targets_promotion_idx")
      expect(expire).toContain("assignments_active_expiry_idx")
    }).pipe(Effect.scoped), 60_000)

  it.live("the merged claim's pick plans the claim index's ordered scan whatever the statistics, and a claim of one target locks one target", () =>
    Effect.gen(function* () {
      const { url, store } = yield* capturedStore
      // A queue of 60,000, analysed, and a generic plan (the one a prepared statement keeps): the
      // count to lock is a parameter, which the planner reads as a tenth of the rows.
      for (let k = 0; k < 6; k++)
        yield* store.recordObservations(Array.from({ length: 10_000 }, (_, i) => ({ source: "github" as const, identity: `q/${k}-${i}`, remoteAt: T0 - DAY })), T0)
      yield* query(url, "ANALYZE targets")
      const generic = yield* pickPlan(url, "GENERIC_PLAN")
      console.log(`the pick's generic plan:\n${generic}`)
      expect(generic).toContain("targets_claim_idx")
      expect(generic).not.toMatch(/Seq Scan on targets|Bitmap Heap Scan on targets|Sort/)

      // A claim of one, left open: another session can lock every other pending target.
      const device = yield* store.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
      expect(yield* store.claim({ deviceId: device.id, slot: 0, now: T0, config: Config.defaults })).not.toBeNull()
      const [pending, lockable] = yield* Effect.promise(async () => {
        const [mine, other] = [new pg.Client({ connectionString: url }), new pg.Client({ connectionString: url })]
        await Promise.all([mine.connect(), other.connect()])
        try {
          await mine.query("BEGIN")
          await mine.query("SELECT count(*) FROM scanfleet_claimable(ARRAY['github'], 1)")
          const count = async (q: string) => Number((await other.query(q)).rows[0].n)
          const result = [
            await count("SELECT count(*) AS n FROM targets WHERE status = 'pending'"),
            await count("SELECT count(*) AS n FROM (SELECT 1 FROM targets WHERE status = 'pending' FOR UPDATE SKIP LOCKED) x")
          ] as const
          await mine.query("ROLLBACK")
          return result
        } finally {
          await Promise.all([mine.end(), other.end()])
        }
      })
      expect(pending - lockable).toBe(1)
    }).pipe(Effect.scoped), 60_000)

  it.live("a batch of results and a progress batch find their reservations by primary key, not by walking a device's active reservations", () =>
    Effect.gen(function* () {
      const { url, wire, store } = yield* capturedStore
      yield* store.recordObservations(Array.from({ length: 200 }, (_, i) => ({ source: "github" as const, identity: `r/${i}`, remoteAt: T0 - DAY })), T0)
      const device = yield* store.addDevice({ name: "d", slots: 64, tokenHash: "h", now: T0 })
      const claimed = yield* store.claimMany({ deviceId: device.id, slots: Array.from({ length: 64 }, (_, s) => s), now: T0, config: Config.defaults })
      expect(claimed).toHaveLength(64)
      const from = wire.sent.length
      const [first] = claimed
      yield* store.appendProgress({ deviceId: first.deviceId, reservationId: first.reservationId, fence: first.fence, now: T0 + 1 }, [
        { seq: 1, kind: "phase", phase: "assigned", at: T0 + 1 }
      ])
      const answers = yield* store.submitResults(
        claimed.map((a) => ({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: T0 + 1, outcome: "clean" as const, finalPhase: null, body: "{}" }))
      )
      expect(answers.every((a) => a._tag === "Right")).toBe(true)
      const accept = find(wire.sent.slice(from), /UPDATE assignments SET state = t\.state/)
      const progress = find(wire.sent.slice(from), /INSERT INTO progress_events/)
      // The generic plan is the one a prepared statement keeps, for 64 active reservations of one
      // device (what a device of 64 slots holds)
      const [results, appended] = yield* Effect.promise(async () => {
        const c = new pg.Client({ connectionString: url })
        await c.connect()
        try {
          // and the history a running fleet keeps: 20,000 ended reservations of the same device
          await c.query(`INSERT INTO assignments (target_id, source, identity, device_id, device_slots, slot, fence, policy_id, issued_at,
              scan_deadline, upload_deadline, expires_at, state, outcome, ended_at)
            SELECT target_id, source, identity, device_id, device_slots, slot, fence, policy_id, issued_at, scan_deadline, upload_deadline,
              expires_at, 'completed', 'clean', issued_at + 1 FROM assignments, generate_series(1, 20000 / 64)`)
          await c.query("ANALYZE assignments")
          const plan = async (text: string) => (await c.query(`EXPLAIN (GENERIC_PLAN) ${text}`)).rows.map((r: Record<string, string>) => r["QUERY PLAN"]).join("\n")
          return [await plan(accept.text), await plan(progress.text)] as const
        } finally {
          await c.end()
        }
      })
      console.log(`results of one device, generic plan:\n${results}\n\nprogress, generic plan:\n${appended}`)
      // (the reservation's scan is inside a subquery aliased s, so the planner names the table s_1)
      expect(results).toMatch(/Index Scan using assignments_pkey on assignments s(_\d+)?\b/)
      expect(results).not.toMatch(/assignments_active_(slot|expiry)_idx on assignments s(_\d+)?\b/)
      expect(appended).toMatch(/Index Scan using assignments_pkey on assignments\b/)
      expect(appended).not.toMatch(/assignments_active_(slot|expiry)_idx on assignments\b/)
    }).pipe(Effect.scoped), 60_000)

  it.live("a batch of results finds each reservation by primary key on a table last analysed while it was young, never scans every reservation", () =>
    Effect.gen(function* () {
      const { url, wire, store } = yield* capturedStore
      yield* store.recordObservations(Array.from({ length: 2_000 }, (_, i) => ({ source: "github" as const, identity: `y/${i}`, remoteAt: T0 - DAY })), T0)
      const device = yield* store.addDevice({ name: "d", slots: 8, tokenHash: "h", now: T0 })
      // statistics of an empty table of reservations, as a fresh fleet's first analyse leaves them
      yield* query(url, "VACUUM ANALYZE targets, assignments, devices, findings")
      // then the first minutes of a fleet, never analysed: 1,200 reservations claimed and completed 8 at a time
      let accept: Sent | undefined
      for (let k = 0; k < 150; k++) {
        const claimed = yield* store.claimMany({ deviceId: device.id, slots: Array.from({ length: 8 }, (_, s) => s), now: T0 + k, config: Config.defaults })
        const from = wire.sent.length
        const answers = yield* store.submitResults(
          claimed.map((a) => ({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: T0 + k, outcome: "clean" as const, finalPhase: null, body: "{}" }))
        )
        expect(answers.every((a) => a._tag === "Right")).toBe(true)
        accept = find(wire.sent.slice(from), /UPDATE assignments SET state = t\.state/)
      }
      // the plan for the last batch's values, and the generic plan a prepared statement may keep
      for (const plan of [yield* explain(url, accept!, "SELECT 1"), yield* explain(url, { ...accept!, values: [] }, "SELECT 1", "(GENERIC_PLAN)")]) {
        console.log(`results of 8 reservations among 1,200 on young statistics:\n${plan}`)
        // as a join it was a hash join over a sequential scan of every reservation, with the
        // filters evaluated on each
        expect(plan).not.toMatch(/Seq Scan on assignments s\b/)
        expect(plan).toMatch(/Index Scan using assignments_pkey on assignments s(_\d+)?\b/)
      }
    }).pipe(Effect.scoped), 60_000)

  it.live("a claim's busy-slot check probes the slot index by device and slot after an analyse, never scans a partial index whole over ended reservations' entries", () =>
    Effect.gen(function* () {
      const { url, wire, store } = yield* capturedStore
      yield* store.recordObservations(Array.from({ length: 200 }, (_, i) => ({ source: "github" as const, identity: `b/${i}`, remoteAt: T0 - DAY })), T0)
      const device = yield* store.addDevice({ name: "d", slots: 64, tokenHash: "h", now: T0 })
      const from = wire.sent.length
      const claimed = yield* store.claimMany({ deviceId: device.id, slots: Array.from({ length: 64 }, (_, s) => s), now: T0, config: Config.defaults })
      expect(claimed).toHaveLength(64)
      const claim = find(wire.sent.slice(from), /scanfleet_claimable/)
      const answers = yield* store.submitResults(
        claimed.map((a) => ({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: T0 + 1, outcome: "clean" as const, finalPhase: null, body: "{}" }))
      )
      expect(answers.every((a) => a._tag === "Right")).toBe(true)
      const plan = yield* Effect.promise(async () => {
        const c = new pg.Client({ connectionString: url })
        await c.connect()
        try {
          // What a running fleet leaves between two vacuums: 20,000 reservations of other devices that
          // were active and have ended, whose entries stay in the partial indexes on active ones; then
          // an analyse that finds none active (as autovacuum's may, between a batch of results and the
          // next claims).
          await c.query(`INSERT INTO assignments (target_id, source, identity, device_id, device_slots, slot, fence, policy_id, issued_at,
              scan_deadline, upload_deadline, expires_at, state)
            SELECT 1, 'github', 'b/0', 1000 + i, 1, 0, 1, 1, ${T0}, ${T0 + DAY}, ${T0 + DAY}, ${T0 + DAY}, 'active' FROM generate_series(0, 19999) AS i`)
          await c.query(`UPDATE assignments SET state = 'completed', outcome = 'clean', ended_at = ${T0 + 1} WHERE device_id >= 1000`)
          await c.query("ANALYZE assignments")
          // the plan of the statement as the store sent it, with its values
          return (await c.query(`EXPLAIN ${claim.text}`, claim.values as Array<unknown>)).rows.map((r: Record<string, string>) => r["QUERY PLAN"]).join("\n")
        } finally {
          await c.end()
        }
      })
      console.log(`the claim's plan after the analyse:\n${plan}`)
      // the check finds the device's entries by its index condition (the slot index, or the device's
      // history when the statistics see about one reservation a device), never by a scan of a whole index
      const check = /Scan using (\w+) on assignments a\b[^\n]*\n\s*(\w[^:]*:[^\n]*)/.exec(plan)
      expect(check?.[1]).toMatch(/^assignments_(active_slot|device)_idx$/)
      expect(check?.[2]).toMatch(/^Index Cond: \(+device_id = d\.id\)/)
    }).pipe(Effect.scoped), 60_000)

  it.live("a discovery batch looks each identity up by the unique index, never hashes the whole table, writes only what is new or newer, and updates a newer known target by its primary key", () =>
    Effect.gen(function* () {
      const { url, wire, store } = yield* capturedStore
      // 60,000 known targets, analysed, then a batch of 5,000 of them (a tenth newer) and 5 new ones
      for (let k = 0; k < 6; k++)
        yield* store.recordObservations(Array.from({ length: 10_000 }, (_, i) => ({ source: "github" as const, identity: `d/${k}-${i}`, remoteAt: T0 - DAY })), T0)
      yield* query(url, "ANALYZE targets")
      const from = wire.sent.length
      const batch = [
        ...Array.from({ length: 5_000 }, (_, i) => ({ source: "github" as const, identity: `d/2-${i}`, remoteAt: i % 10 === 0 ? T0 : T0 - DAY })),
        ...Array.from({ length: 5 }, (_, i) => ({ source: "github" as const, identity: `d/new-${i}`, remoteAt: null }))
      ]
      expect(yield* store.recordObservations(batch, T0 + 1)).toEqual({ inserted: Array.from({ length: 5 }, (_, i) => `d/new-${i}`), known: 5_000 })
      const sent = find(wire.sent.slice(from), /INSERT INTO targets/)
      const plan = yield* explain(url, sent, "SELECT 1")
      console.log(`a discovery batch:\n${plan}`)
      expect(plan).toMatch(/Index Scan using targets_source_identity_key on targets/)
      expect(plan).not.toMatch(/Seq Scan on targets|Bitmap Heap Scan on targets|Hash (Anti |Right |Left )Join/)
      // a newer known target is updated through its key, not handed to the ON CONFLICT (a second probe and a logged lock each)
      expect(plan).toMatch(/Update on targets[\s\S]*Index Scan using targets_pkey on targets\b[^\n]*\n\s*Index Cond: \(id = ANY/)
      // ids count targets: the new ones follow the 60,000 with no gap
      expect((yield* store.getTarget("github", "d/new-0")).id).toBe(60_001)
      // an unchanged target the batch named is neither rewritten nor locked (a row lock would leave its xmax set)
      const [{ newer, locked }] = yield* query(url, `SELECT count(*) FILTER (WHERE observed_remote_at = ${T0})::int AS newer,
          count(*) FILTER (WHERE observed_remote_at = ${T0 - DAY} AND xmax::text <> '0')::int AS locked
        FROM targets`)
      expect(newer).toBe(500)
      expect(locked).toBe(0)
    }).pipe(Effect.scoped), 60_000)

  it.live("a percentile window whose edges fall mid-hour reads each stretch of the rollups as a range of the key by span and start, whether it names a source or not", () =>
    Effect.gen(function* () {
      const { url, wire, store } = yield* capturedStore
      // 100,000 durations over seven days, every source, metric and outcome, analysed
      const sources = ["github", "gitlab", "huggingface", "dockerhub"] as const
      const metrics = ["end_to_end", "scanning", "cleanup", "bundling", "upload"] as const
      const outcomes = ["clean", "findings", "scan_error"] as const
      const end = T0 + 7 * DAY
      for (let k = 0; k < 10; k++)
        yield* store.recordDurations(
          Array.from({ length: 10_000 }, (_, j) => {
            const i = k * 10_000 + j
            return { source: sources[i % 4], metric: metrics[(i >> 2) % 5], outcome: outcomes[(i >> 4) % 3], ms: 1 + ((i * 7919) % 100_000), at: end - 1 - ((i * 104_729) % (7 * DAY)) }
          })
        )
      yield* query(url, "ANALYZE duration_rollups, durations")
      // edges 39 and 20 minutes past a ten-minute mark: whole days, with an hour and ten minutes
      // added or taken away at the edges
      const window = { from: end - 7 * DAY + 2_345_678, to: end - 1_234_567, minSamples: 1 }
      const queries: ReadonlyArray<Store.PercentileQuery> = [window, { ...window, source: "dockerhub" }]
      for (const q of queries) {
        const from = wire.sent.length
        expect((yield* store.percentiles(q)).length).toBeGreaterThan(0)
        const analysed = yield* explain(url, find(wire.sent.slice(from), /FROM duration_rollups/), "SELECT 1", "(ANALYZE, BUFFERS, TIMING OFF, COSTS OFF)")
        console.log(`percentiles ${q.source ?? "over every source"}:\n${analysed}`)
        // every stretch of rollups is a range of the key: at most one descent of the index per span
        // in the stretch (the old key, led by the groups, descended once per group: 61 times)
        expect(analysed).not.toMatch(/Seq Scan on duration_rollups/)
        const scans = nodes(analysed, /(?:Bitmap Index Scan on|Index (?:Only )?Scan using) duration_rollups_pkey\b/)
        // one for each stretch of rollups the window's plan reads
        expect(scans.length).toBe(Rollups.plan(q.from, q.to).filter((p) => p._tag === "rollup").length)
        for (const detail of scans) {
          const cond = /Index Cond: \(+span = '(\d+)'::bigint\) AND \(start >= '(\d+)'::bigint\) AND \(start < '(\d+)'::bigint\)/.exec(detail)
          expect(cond, detail).not.toBeNull()
          const [span, lo, hi] = cond!.slice(1).map(Number)
          const searches = Number(/Index Searches: (\d+)/.exec(detail)?.[1])
          expect(searches, detail).toBeLessThanOrEqual((hi - lo) / span + 1)
        }
      }
    }).pipe(Effect.scoped), 120_000)
})
