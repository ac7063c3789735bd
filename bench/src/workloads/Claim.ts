/**
 * Workloads 1 and 2: claim + fenced complete, one at a time and in batches,
 * against scanfleet's Store, graphile-worker, pg-boss and the raw SQL pattern.
 * Every system gets a fresh database with the same backlog; rows are kept
 * where the system keeps them (graphile-worker deletes completed jobs: that is
 * its design, and it is said in the table notes).
 */
import { Effect } from "effect"
import { Logger, makeWorkerUtils, run as runGraphile, runMigrations } from "graphile-worker"
import pg from "pg"
import PgBoss from "pg-boss"
import { chunks, loops, since, size, type Ctx } from "../Context.js"
import type { Contender, Sample, WorkloadResult } from "../Report.js"
import { measure, meter } from "../Report.js"
import * as Scanfleet from "../Scanfleet.js"

const silent = new Logger(() => () => {})

interface Shape {
  /** Jobs waiting when the measured section starts. */
  readonly backlog: number
  /** Jobs processed in the measured section (taken from the head of the backlog). */
  readonly jobs: number
  /** Concurrent claimers. */
  readonly claimers: number
  /** Claim batch: 1 for workload 1. */
  readonly batch: number
  /** A slow system stops after this many seconds; its rate is what it did by then. */
  readonly capSeconds: number
}

/** One run of one system: fresh database, seed, warm up, reset counters, measure, verify, drop. */
const withDb = async (ctx: Ctx, prefix: string, body: (db: { name: string; url: string }) => Promise<Sample>) => {
  const db = await ctx.pg.freshDb(prefix)
  try {
    return await body(db)
  } finally {
    await ctx.pg.dropDb(db.name)
  }
}

// ---------------------------------------------------------------- scanfleet

/**
 * scanfleet's claimers are device slots. `oneDevice`: all claimers are slots of
 * one device; otherwise one device per claimer (one slot each, or `batch` slots
 * claimed at once with Store.claimMany and completed with Store.submitResults).
 */
const scanfleet = (ctx: Ctx, s: Shape, oneDevice = false, apart = false): Contender => ({
  name:
    s.batch === 1
      ? `scanfleet PgStore (${oneDevice ? `1 device x ${s.claimers} slots` : `${s.claimers} devices x 1 slot`}${apart ? ", claim and result apart" : ""})`
      : "scanfleet PgStore",
  note:
    s.batch === 1
      ? apart
        ? `${oneDevice ? `${s.claimers} slots of one device` : `${s.claimers} devices of one slot`}, each a loop of Store.claim then Store.submitResult(outcome clean); pool of ${s.claimers + 2}`
        : `${oneDevice ? `${s.claimers} slots of one device` : `${s.claimers} devices of one slot`}, each a Store.claim, then a loop of Store.submitResultAndClaim (outcome clean, then the slot's next job, in one call) and a Store.submitResult for its last job; pool of ${s.claimers + 2}`
      : `${s.claimers} devices of ${s.batch} slots; each claims all its slots at once (one Store.claimMany) and submits the ${s.batch} results at once (one Store.submitResults); pool of ${s.claimers + 2}`,
  run: () =>
    withDb(ctx, "sf_claim", async (db) => {
      const sf = await Scanfleet.openPg(db.url, s.claimers + 2)
      try {
        const now = Date.now()
        const devices = await sf.run((st) =>
          Effect.forEach(Array.from({ length: oneDevice ? 1 : s.claimers }), (_, i) =>
            st.addDevice({ name: `bench-${i}`, slots: oneDevice ? s.claimers : s.batch, tokenHash: `hash-${i}`, now })
          )
        )
        for (const c of chunks(Array.from({ length: s.backlog }, (_, i) => i), 10_000))
          await sf.run((st) => st.recordObservations(c.map((i) => ({ source: "github" as const, identity: `org/repo-${i}`, remoteAt: now - 1000 })), now))
        await ctx.pg.analyze(db.name)
        // open every pool connection before the measured section
        await sf.run((st) => Effect.all(Array.from({ length: s.claimers + 2 }, () => st.countTargets()), { concurrency: "unbounded" }))
        await ctx.pg.resetStatements()
        const wal0 = await ctx.pg.walBytes()
        const costs = await meter(ctx.pg)
        let taken = 0
        const t0 = performance.now()
        const deadline = t0 + s.capSeconds * 1000
        const claimOne = (deviceId: number, slot: number) =>
          sf.run((st) =>
            Effect.gen(function* () {
              const a = yield* st.claim({ deviceId, slot, now: Date.now(), config: Scanfleet.config })
              if (a === null) throw new Error("backlog ran dry")
              return a
            })
          )
        const resultOf = (a: { reservationId: number; fence: number; deviceId: number }) =>
          ({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: Date.now(), outcome: "clean", finalPhase: null, body: "{}" }) as const
        const complete = (a: { reservationId: number; fence: number; deviceId: number }) => sf.run((st) => st.submitResult(resultOf(a)))
        const completeAndClaim = (a: { reservationId: number; fence: number; deviceId: number; slot: number }) =>
          sf.run((st) =>
            Effect.gen(function* () {
              const r = yield* st.submitResultAndClaim(resultOf(a), { slot: a.slot, config: Scanfleet.config })
              if (r.next === null) throw new Error(r.claimRefused === null ? "backlog ran dry" : `claim refused: ${r.claimRefused.message}`)
              return r.next
            })
          )
        const more = () => taken < s.jobs && performance.now() < deadline
        if (s.batch === 1 && apart) {
          await loops(s.claimers, async (i) => {
            while (more()) {
              taken++
              await complete(await (oneDevice ? claimOne(devices[0].id, i) : claimOne(devices[i].id, 0)))
            }
          })
        } else if (s.batch === 1) {
          // a job is a claim and a result: the first claim on its own, each result with the next claim, the last result on its own
          await loops(s.claimers, async (i) => {
            if (!more()) return
            taken++
            let a = await (oneDevice ? claimOne(devices[0].id, i) : claimOne(devices[i].id, 0))
            for (;;) {
              if (!more()) return void (await complete(a))
              taken++
              a = await completeAndClaim(a)
            }
          })
        } else {
          await loops(s.claimers, async (d) => {
            while (taken < s.jobs && performance.now() < deadline) {
              const n = Math.min(s.batch, s.jobs - taken)
              taken += n
              const got = await sf.run((st) =>
                st.claimMany({ deviceId: devices[d].id, slots: Array.from({ length: n }, (_, slot) => slot), now: Date.now(), config: Scanfleet.config })
              )
              if (got.length !== n) throw new Error("backlog ran dry")
              const answers = await sf.run((st) =>
                st.submitResults(
                  got.map((a) => ({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: Date.now(), outcome: "clean" as const, finalPhase: null, body: "{}" }))
                )
              )
              if (answers.some((r) => r._tag !== "Right")) throw new Error("a fenced complete was refused")
            }
          })
        }
        const secs = since(t0)
        const cost = await costs.end(taken)
        const stmts = await ctx.pg.statements(db.name)
        const profile = await ctx.pg.profile(db.name, taken)
        if (process.env.BENCH_TRACE) {
          for (const x of await ctx.pg.topStatements(db.name, 25)) ctx.log(`      ${x.calls} calls ${x.ms} ms: ${x.query}`)
          for (const x of await ctx.pg.walRecords(wal0, taken)) ctx.log(`      WAL ${x.record}: ${x.perUnit.toFixed(2)} records, ${x.bytesPerUnit.toFixed(0)} bytes per job`)
        }
        const counts = await sf.run((st) => st.countTargets())
        const done = counts.filter((c) => c.status === "completed").reduce((n, c) => n + c.count, 0)
        if (done !== taken) throw new Error(`verification: ${done} targets completed, expected ${taken}`)
        // What the hot path left for later: a percentile read folds the pending durations (and
        // rollups) of every result first; its cost per job is shown apart, and it must count them all.
        const folding = await meter(ctx.pg)
        const read = await sf.run((st) => st.percentiles({ from: 0, to: Date.now() + 1, source: "github", metric: "end_to_end", minSamples: 1 }))
        const fold = await folding.end(taken)
        if ((read[0]?.count ?? 0) !== taken) throw new Error(`verification: percentiles counted ${read[0]?.count ?? 0} results, expected ${taken}`)
        const later = {
          "later durations fold + read, client CPU µs/job": fold.cpu!.clientMicros,
          "server CPU µs/job": fold.cpu!.serverMicros,
          "WAL bytes/job": fold.walPerUnit!
        }
        return { value: taken / secs, statementsPerUnit: stmts / taken, ...cost, extra: { "jobs measured": taken, ...later }, profile }
      } finally {
        await sf.close()
      }
    })
})

// ---------------------------------------------------------------- raw SQL

const rawSchema = `
  CREATE TABLE jobs (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status TEXT NOT NULL DEFAULT 'pending',
    fence INTEGER NOT NULL DEFAULT 0,
    payload TEXT NOT NULL,
    claimed_at TIMESTAMPTZ,
    completed_at TIMESTAMPTZ
  );
  CREATE INDEX jobs_pending_idx ON jobs (id) WHERE status = 'pending';`

const rawClaim = `
  WITH c AS (SELECT id FROM jobs WHERE status = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
  UPDATE jobs j SET status = 'running', fence = j.fence + 1, claimed_at = now()
  FROM c WHERE j.id = c.id
  RETURNING j.id, j.fence`

const rawComplete = `
  UPDATE jobs j SET status = 'done', completed_at = now()
  FROM unnest($1::bigint[], $2::int[]) AS u(id, fence)
  WHERE j.id = u.id AND j.fence = u.fence AND j.status = 'running'`

const raw = (ctx: Ctx, s: Shape): Contender => ({
  name: s.batch === 1 ? "raw SQL (fenced SKIP LOCKED)" : `raw SQL (fenced SKIP LOCKED, batch ${s.batch})`,
  note: `one WITH c AS (SELECT ... LIMIT ${s.batch} FOR UPDATE SKIP LOCKED) UPDATE ... RETURNING id, fence; one fenced UPDATE to complete; both named prepared statements; ${s.claimers} pool connections`,
  run: () =>
    withDb(ctx, "raw_claim", async (db) => {
      const pool = new pg.Pool({ connectionString: db.url, max: s.claimers })
      pool.on("error", () => {})
      try {
        await pool.query(rawSchema)
        await pool.query("INSERT INTO jobs (payload) SELECT '{}' FROM generate_series(1, $1)", [s.backlog])
        await ctx.pg.analyze(db.name)
        await Promise.all(Array.from({ length: s.claimers }, () => pool.query("SELECT 1")))
        await ctx.pg.resetStatements()
        const costs = await meter(ctx.pg)
        let taken = 0
        const t0 = performance.now()
        const deadline = t0 + s.capSeconds * 1000
        await loops(s.claimers, async () => {
          while (taken < s.jobs && performance.now() < deadline) {
            const n = Math.min(s.batch, s.jobs - taken)
            taken += n
            // named prepared statements: parsed and planned once per connection, as a careful hand-written queue would
            const r = await pool.query({ name: "raw_claim", text: rawClaim, values: [n] })
            if (r.rowCount !== n) throw new Error("backlog ran dry")
            const c = await pool.query({ name: "raw_complete", text: rawComplete, values: [r.rows.map((x) => x.id), r.rows.map((x) => x.fence)] })
            if (c.rowCount !== n) throw new Error("a fenced complete was refused")
          }
        })
        const secs = since(t0)
        const cost = await costs.end(taken)
        const stmts = await ctx.pg.statements(db.name)
        const done = Number((await pool.query("SELECT count(*) FROM jobs WHERE status = 'done'")).rows[0].count)
        if (done !== taken) throw new Error(`verification: ${done} done, expected ${taken}`)
        return { value: taken / secs, statementsPerUnit: stmts / taken, ...cost, extra: { "jobs measured": taken } }
      } finally {
        await pool.end()
      }
    })
})

// ---------------------------------------------------------------- graphile-worker

const graphile = (ctx: Ctx, s: Shape, localQueue: boolean): Contender => ({
  name: localQueue ? "graphile-worker 0.17 (local queue)" : "graphile-worker 0.17 (default)",
  note: localQueue
    ? `concurrency ${s.claimers}, localQueue.size ${Math.max(s.batch, 2)}, completeJobBatchDelay 0; deletes completed jobs; no fencing of completion`
    : `concurrency ${s.claimers}, default options; deletes completed jobs; no fencing of completion`,
  run: () =>
    withDb(ctx, "gw_claim", async (db) => {
      await runMigrations({ connectionString: db.url, logger: silent })
      const utils = await makeWorkerUtils({ connectionString: db.url, logger: silent })
      try {
        for (const c of chunks(Array.from({ length: s.backlog }, (_, i) => i), 10_000))
          await utils.addJobs(c.map((i) => ({ identifier: "noop", payload: { i } })))
      } finally {
        await utils.release()
      }
      await ctx.pg.analyze(db.name)
      let done = 0
      let t0 = 0
      let statementsAt = 0
      let resolveDone!: () => void
      const finished = new Promise<void>((r) => (resolveDone = r))
      // our own pool, so that it is surely closed before the database is dropped
      const pool = new pg.Pool({ connectionString: db.url, max: Math.max(10, s.claimers + 2) })
      pool.on("error", () => {})
      pool.on("connect", (c) => c.on("error", () => {}))
      await ctx.pg.resetStatements()
      const costs = await meter(ctx.pg)
      const runner = await runGraphile({
        pgPool: pool,
        concurrency: s.claimers,
        noHandleSignals: true,
        pollInterval: 2000,
        logger: silent,
        preset: localQueue ? { worker: { localQueue: { size: Math.max(s.batch, 2) }, completeJobBatchDelay: 0 } } : {},
        taskList: {
          noop: async () => {
            if (t0 === 0) {
              t0 = performance.now()
            }
            done++
            if (done === s.jobs || performance.now() - t0 > s.capSeconds * 1000) resolveDone()
          }
        }
      })
      try {
        let guard: NodeJS.Timeout | undefined
        await Promise.race([finished, new Promise((_, reject) => (guard = setTimeout(() => reject(new Error("graphile-worker ran no jobs for 60 s")), (s.capSeconds + 60) * 1000)))])
        clearTimeout(guard)
        const secs = since(t0)
        const measured = done
        const cost = await costs.end(done)
        // statements over the whole life of the runner, including its start, divided by the jobs it finished by then
        statementsAt = await ctx.pg.statements(db.name)
        return { value: measured / secs, statementsPerUnit: statementsAt / done, ...cost, extra: { "jobs measured": measured } }
      } finally {
        await runner.stop()
        await pool.end()
      }
    })
})

// ---------------------------------------------------------------- pg-boss

const pgBoss = (ctx: Ctx, s: Shape): Contender => ({
  name: s.batch === 1 ? "pg-boss 10" : `pg-boss 10 (batch ${s.batch})`,
  note: `${s.claimers} loops of boss.fetch(batchSize ${s.batch}) then boss.complete(ids); supervise, schedule off; keeps completed rows; no fencing of completion`,
  run: () =>
    withDb(ctx, "boss_claim", async (db) => {
      const boss = new PgBoss({ connectionString: db.url, max: s.claimers + 2, supervise: false, schedule: false })
      boss.on("error", () => {})
      await boss.start()
      try {
        await boss.createQueue("bench")
        for (const c of chunks(Array.from({ length: s.backlog }, (_, i) => i), 10_000)) await boss.insert(c.map((i) => ({ name: "bench", data: { i } })))
        await ctx.pg.analyze(db.name)
        await ctx.pg.resetStatements()
        const costs = await meter(ctx.pg)
        let taken = 0
        const t0 = performance.now()
        const deadline = t0 + s.capSeconds * 1000
        await loops(s.claimers, async () => {
          while (taken < s.jobs && performance.now() < deadline) {
            const n = Math.min(s.batch, s.jobs - taken)
            taken += n
            const got = await boss.fetch("bench", { batchSize: n })
            if (got.length !== n) throw new Error("backlog ran dry")
            await boss.complete("bench", got.map((j) => j.id))
          }
        })
        const secs = since(t0)
        const cost = await costs.end(taken)
        const stmts = await ctx.pg.statements(db.name)
        const done = Number((await boss.getDb().executeSql("SELECT count(*) AS n FROM pgboss.job WHERE name = 'bench' AND state = 'completed'", [])).rows[0].n)
        if (done !== taken) throw new Error(`verification: ${done} completed, expected ${taken}`)
        return { value: taken / secs, statementsPerUnit: stmts / taken, ...cost, extra: { "jobs measured": taken } }
      } finally {
        await boss.stop({ graceful: false, wait: true, close: true })
      }
    })
})

/** Workload 1: one at a time, 8 concurrent claimers. */
export const one = async (ctx: Ctx): Promise<WorkloadResult> => {
  const s: Shape = {
    backlog: size(ctx, "claim.backlog", 10_000, 50_000),
    jobs: size(ctx, "claim.jobs", 3_000, 10_000),
    claimers: 8,
    batch: 1,
    capSeconds: size(ctx, "claim.cap", 2, 12)
  }
  const missing = await Scanfleet.pgMissing()
  const list = [...(missing ? [] : [scanfleet(ctx, s), scanfleet(ctx, s, true), scanfleet(ctx, s, false, true)]), graphile(ctx, s, false), raw(ctx, s), pgBoss(ctx, s)]
  const notes = missing ? [`scanfleet not measured: ${missing}`] : []
  return {
    id: "1",
    title: `Claim + fenced complete, one at a time (${s.claimers} concurrent claimers, ${s.backlog.toLocaleString("en-US")} backlog, up to ${s.jobs.toLocaleString("en-US")} jobs or ${s.capSeconds} s per run, rows kept)`,
    goal: ">= 1.0x graphile-worker default, >= 0.9x raw SQL, <= 2 statements per job",
    unit: "jobs/s",
    higherIsBetter: true,
    systems: await measure(list, ctx.runs, ctx.log),
    notes: [...notes, "graphile-worker's statement count covers the runner's whole life (start-up, LISTEN, polling) divided by the jobs finished when it was read"]
  }
}

/** Workload 2: batched claims and coalesced completes. */
export const batched = async (ctx: Ctx): Promise<WorkloadResult> => {
  const s: Shape = {
    backlog: size(ctx, "batch.backlog", 20_000, 60_000),
    jobs: size(ctx, "batch.jobs", 5_000, 50_000),
    claimers: 8,
    batch: 64,
    capSeconds: size(ctx, "batch.cap", 2, 12)
  }
  const missing = await Scanfleet.pgMissing()
  const list = [
    ...(missing ? [] : [scanfleet(ctx, s)]),
    graphile(ctx, { ...s, batch: 100 }, true),
    raw(ctx, { ...s, batch: 100 }),
    pgBoss(ctx, { ...s, batch: 100 })
  ]
  return {
    id: "2",
    title: `Batched claims (${s.claimers} claimers; scanfleet devices of ${s.batch} slots, the others batches of 100) and coalesced completes, ${s.backlog.toLocaleString("en-US")} backlog, up to ${s.jobs.toLocaleString("en-US")} jobs or ${s.capSeconds} s per run`,
    goal: ">= 1.5x graphile-worker with its local queue, >= 0.7x raw SQL at batch 100",
    unit: "jobs/s",
    higherIsBetter: true,
    systems: await measure(list, ctx.runs, ctx.log),
    notes: missing ? [`scanfleet not measured: ${missing}`] : []
  }
}
