/**
 * Workload 3: claim + complete against a large targets table for a long time,
 * comparing the claim rate and the buffers read per claim of the first and the
 * last window (bounded or growing). The full run is the goal's size: 1M claims
 * against 2M pending rows, in 10-second windows (the goal names minutes; a
 * million batched claims take less than two), 8 devices of 64 slots claiming
 * and completing in batches (Store.claimMany, Store.submitResults), so that a
 * million claims fit the run; `--quick` is a short form of the same shape.
 * Sizes can be set with `--set soak.rows=... --set soak.claims=... --set
 * soak.seconds=... --set soak.window=... --set soak.batch=...`; the run stops at
 * whichever of claims and seconds comes first.
 */
import { Effect } from "effect"
import pg from "pg"
import { loops, size, type Ctx } from "../Context.js"
import { measure, meter, type Contender, type Sample, type WorkloadResult } from "../Report.js"
import * as Scanfleet from "../Scanfleet.js"

const DAY = 86_400_000

// Setup shared by both schemas: pending rows in one statement.
const seedSql = `
  INSERT INTO targets (source, identity, status, observed_remote_at, discovered_at)
  SELECT 'github', 'soak/' || i, 'pending', $1::bigint - ${DAY}, $1::bigint FROM generate_series(1, $2::int) AS i`

// Buffers touched by the claim statement so far: scanfleet's picks in scanfleet_claimable (whose
// buffers count in the calling statement's), the raw pattern's UPDATE over a SKIP LOCKED select; not
// the sweep's statements, which lock with SKIP LOCKED too.
const claimBuffers = `
  SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0)::float8 AS blks
  FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)
    AND (query ILIKE '%scanfleet_claimable(%' OR (query ILIKE '%SKIP LOCKED%' AND query ILIKE '%UPDATE targets t SET%'))`

interface Shape {
  readonly rows: number
  /** Stop after this many claims (0: no limit) or `seconds`, whichever comes first. */
  readonly claims: number
  readonly seconds: number
  readonly windowSeconds: number
  readonly claimers: number
  /** Targets claimed (and completed) at once by one claimer. */
  readonly batch: number
}

const soakRun = async (
  ctx: Ctx,
  s: Shape,
  prefix: string,
  // `one` claims and completes up to `batch` targets for claimer i and says how many it took.
  open: (url: string) => Promise<{
    prepare: (c: pg.Client) => Promise<void>
    one: (i: number) => Promise<number>
    /** The sweeps ended since the last call and the slowest of them, ms (none for a system without a sweep). */
    sweeps?: () => { readonly n: number; readonly slowestMs: number }
    /** What the window's line adds about the system's own state, read on a connection of its database. */
    probe?: (c: pg.Client) => Promise<string>
    close: () => Promise<void>
  }>
): Promise<Sample> => {
  const db = await ctx.pg.freshDb(prefix)
  const admin = new pg.Client({ connectionString: ctx.pg.url("postgres") })
  await admin.connect()
  const d = await open(db.url)
  const probe = d.probe ? new pg.Client({ connectionString: db.url }) : undefined
  await probe?.connect()
  try {
    const c = new pg.Client({ connectionString: db.url })
    await c.connect()
    await d.prepare(c)
    await c.query(seedSql, [Date.now(), s.rows])
    await c.end()
    await ctx.pg.analyze(db.name)
    await ctx.pg.resetStatements()
    const windowMs = s.windowSeconds * 1000
    const counts: Array<number> = []
    const buffers: Array<number> = []
    let slowestSweep = 0
    let done = 0
    let last = { blks: 0, done: 0 }
    const costs = await meter(ctx.pg)
    d.sweeps?.() // those of the seeding are not the measured section's
    const t0 = performance.now()
    const ticker = setInterval(async () => {
      counts.push(done)
      const at = done
      const r = (await admin.query(claimBuffers, [db.name]).catch(() => ({ rows: [last] }))).rows[0]
      buffers.push((r.blks - last.blks) / Math.max(1, at - last.done))
      last = { blks: r.blks, done: at }
      const k = counts.length
      const sw = d.sweeps?.()
      if (sw !== undefined) slowestSweep = Math.max(slowestSweep, sw.slowestMs)
      const sweeps = sw === undefined ? "" : `, ${sw.n} sweeps (slowest ${Math.round(sw.slowestMs)} ms)`
      const state = probe && d.probe ? `; ${await d.probe(probe).catch((e: unknown) => `probe failed: ${e instanceof Error ? e.message : String(e)}`)}` : ""
      ctx.log(`      window ${k}: ${Math.round((done - (k > 1 ? counts[k - 2] : 0)) / s.windowSeconds)} claims/s, ${buffers[k - 1].toFixed(1)} buffers/claim, ${done.toLocaleString("en-US")} claims${sweeps}${state}`)
    }, windowMs)
    const more = () => performance.now() - t0 < s.seconds * 1000 && (s.claims <= 0 || done < s.claims)
    try {
      await loops(s.claimers, async (i) => {
        while (more()) {
          // not `done += await …`: that reads `done` before the wait, and the claimers' sums overwrite each other
          const n = await d.one(i)
          done += n
        }
      })
    } finally {
      // a failed run must not leave its ticker reading through a closed client (that ended the whole bench)
      clearInterval(ticker)
    }
    const cost = await costs.end(done)
    // Only whole windows count; a run shorter than two windows has no trend to show.
    if (counts.length < 2) throw new Error(`soak: ${counts.length} whole window(s) of ${s.windowSeconds} s; run longer or use a shorter soak.window`)
    const rates = counts.map((n, k) => (n - (k ? counts[k - 1] : 0)) / s.windowSeconds)
    const first = rates[0]
    const lastRate = rates[rates.length - 1]
    return {
      value: lastRate / first,
      ...cost,
      extra: {
        "first window claims/s": first,
        "last window claims/s": lastRate,
        "first window buffers/claim": buffers[0],
        "last window buffers/claim": buffers[buffers.length - 1],
        "worst window buffers/claim": Math.max(...buffers),
        ...(d.sweeps === undefined ? {} : { "slowest sweep ms": slowestSweep }),
        windows: counts.length,
        claims: done,
        seconds: (performance.now() - t0) / 1000
      }
    }
  } finally {
    await d.close()
    await probe?.end().catch(() => {})
    await admin.end()
    await ctx.pg.dropDb(db.name)
  }
}

/** Workload 3. */
export const soak = async (ctx: Ctx): Promise<Array<WorkloadResult>> => {
  const s: Shape = {
    rows: size(ctx, "soak.rows", 400_000, 2_000_000),
    claims: size(ctx, "soak.claims", 300_000, 1_000_000),
    seconds: size(ctx, "soak.seconds", 40, 1_200),
    // windows short enough that the fastest contender (raw SQL, about 25,000 claims/s here) has several
    windowSeconds: size(ctx, "soak.window", 2, 10),
    claimers: 8,
    batch: size(ctx, "soak.batch", 64, 64)
  }
  const withRaw = size(ctx, "soak.raw", 1, 1) !== 0
  const missing = await Scanfleet.pgMissing()
  const contenders: Array<Contender> = [
    ...(missing
      ? []
      : [
          {
            name: "scanfleet PgStore",
            note: `${s.claimers} devices of ${s.batch} slots, each a loop of Store.claimMany (all its slots) then Store.submitResults; the server's sweep (Store.expireDue: expiry, a batch of durations folded, the claim head raised) every second, as a deployed server runs it`,
            run: () =>
              soakRun(ctx, s, "sf_soak", async (url) => {
                const sf = await Scanfleet.openPg(url, s.claimers + 2)
                const devices: Array<number> = []
                const slots = Array.from({ length: s.batch }, (_, k) => k)
                let empty = 0
                // the sweeper of a deployed server (its default interval), one sweep at a time
                let sweeper: NodeJS.Timeout | undefined
                let sweeping: Promise<unknown> = Promise.resolve()
                const sweeps = { n: 0, slowestMs: 0, startedAt: 0 }
                let head: { key: number; seq: number } | undefined
                let busy = false
                const stopSweeping = async () => {
                  clearInterval(sweeper)
                  await sweeping
                }
                return {
                  prepare: async () => {
                    const now = Date.now()
                    for (let i = 0; i < s.claimers; i++) devices.push((await sf.run((st) => st.addDevice({ name: `soak-${i}`, slots: s.batch, tokenHash: `h${i}`, now }))).id)
                    sweeper = setInterval(() => {
                      if (busy) return
                      busy = true
                      const t = (sweeps.startedAt = performance.now())
                      sweeping = sf
                        .run((st) => st.expireDue({ now: Date.now(), maxAttempts: 5, limit: 1000 }))
                        .catch((e: unknown) => ctx.log(`      sweep failed: ${e instanceof Error ? e.message : String(e)}`))
                        .finally(() => {
                          busy = false
                          sweeps.n++
                          sweeps.slowestMs = Math.max(sweeps.slowestMs, performance.now() - t)
                        })
                    }, 1000)
                  },
                  one: (i) =>
                    sf.run((st) =>
                      Effect.gen(function* () {
                        const got = yield* st.claimMany({ deviceId: devices[i], slots, now: Date.now(), config: Scanfleet.config })
                        if (got.length === 0) {
                          // A claim may find every candidate it reached locked by the other claimers (SKIP LOCKED):
                          // only an empty queue is an error; the empty answers are counted in the table.
                          const pending = (yield* st.countTargets()).filter((c) => c.status === "pending").reduce((n, c) => n + c.count, 0)
                          if (pending === 0) throw new Error("backlog ran dry")
                          empty++
                          return 0
                        }
                        const answers = yield* st.submitResults(
                          got.map((a) => ({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: Date.now(), outcome: "clean" as const, finalPhase: null, body: "{}" }))
                        )
                        if (answers.some((r) => r._tag !== "Right")) throw new Error("a fenced complete was refused")
                        return got.length
                      })
                    ),
                  // Tells apart what could make a window's claims read far more buffers: a claim head that
                  // stopped moving (claims then walk every entry claimed since), or a plan that reads the
                  // table (sequential scans of targets), and whether an autovacuum or an analyse came between.
                  probe: async (c) => {
                    const r = (
                      await c.query(`SELECT h.key::float8 AS key, h.epoch::float8 AS epoch, s.seq_scan::float8 AS seq, s.autovacuum_count::float8 AS av,
                        s.autoanalyze_count::float8 AS aa FROM claim_head h, pg_stat_user_tables s WHERE s.relname = 'targets'`)
                    ).rows[0] as { key: number; epoch: number; seq: number; av: number; aa: number }
                    const was = head ?? r
                    head = r
                    return `claim head +${r.key - was.key} (epoch ${r.epoch}), targets: ${r.seq - was.seq} sequential scans, autovacuum ${r.av}, autoanalyze ${r.aa}`
                  },
                  sweeps: () => {
                    // a sweep still running counts with its age so far
                    const now = { n: sweeps.n, slowestMs: Math.max(sweeps.slowestMs, busy ? performance.now() - sweeps.startedAt : 0) }
                    sweeps.n = 0
                    sweeps.slowestMs = 0
                    return now
                  },
                  close: async () => {
                    await stopSweeping()
                    if (empty > 0) ctx.log(`      ${empty} claim calls found every candidate locked by the other claimers and took nothing`)
                    return sf.close()
                  }
                }
              })
          }
        ]),
    ...(withRaw ? [{
      name: "raw SQL (fenced SKIP LOCKED)",
      note: `the pattern of workload 2 (batches of ${s.batch}) on a table with scanfleet's target columns and pending index`,
      run: () =>
        soakRun(ctx, s, "raw_soak", async (url) => {
          const pool = new pg.Pool({ connectionString: url, max: s.claimers })
          pool.on("error", () => {})
          return {
            prepare: async (c) => {
              await c.query(`
                CREATE TABLE targets (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, source TEXT NOT NULL, identity TEXT NOT NULL, status TEXT NOT NULL,
                  observed_remote_at BIGINT, covered_remote_at BIGINT, completed_at BIGINT, last_scan_started_at BIGINT, fence INTEGER NOT NULL DEFAULT 0,
                  discovered_at BIGINT NOT NULL, UNIQUE (source, identity));
                CREATE INDEX targets_pending_idx ON targets (id) WHERE status = 'pending';`)
            },
            one: async () => {
              // named prepared statements, as in workload 1
              const r = await pool.query({
                name: "soak_claim",
                text: `WITH c AS (SELECT id FROM targets WHERE status = 'pending' ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)
                 UPDATE targets t SET status = 'in_progress', fence = t.fence + 1, covered_remote_at = t.observed_remote_at, last_scan_started_at = $1
                 FROM c WHERE t.id = c.id RETURNING t.id, t.fence`,
                values: [Date.now(), s.batch]
              })
              if (r.rowCount === 0) {
                // SKIP LOCKED may find every candidate it reached locked by the other claimers: only an empty queue is an error
                if ((await pool.query("SELECT EXISTS (SELECT 1 FROM targets WHERE status = 'pending') AS any")).rows[0].any) return 0
                throw new Error(`backlog ran dry: ${JSON.stringify((await pool.query("SELECT status, count(*)::int AS n FROM targets GROUP BY 1")).rows)}`)
              }
              const c = await pool.query({
                name: "soak_complete",
                text: `UPDATE targets t SET status = 'completed', completed_at = $3 FROM unnest($1::bigint[], $2::int[]) AS u(id, fence)
                 WHERE t.id = u.id AND t.fence = u.fence AND t.status = 'in_progress'`,
                values: [r.rows.map((x) => x.id), r.rows.map((x) => x.fence), Date.now()]
              })
              if (c.rowCount !== r.rowCount) throw new Error("a fenced complete was refused")
              return r.rowCount ?? 0
            },
            close: () => pool.end()
          }
        })
    }] : [])
  ]
  return [
    {
      id: "3",
      title: `Soak: claim + complete against ${s.rows.toLocaleString("en-US")} pending targets, ${s.claims > 0 ? `${s.claims.toLocaleString("en-US")} claims or ` : ""}${s.seconds} s, ${s.claimers} claimers of ${s.batch}, windows of ${s.windowSeconds} s`,
      goal: "last window's rate >= 0.8x the first's (goal stated for 1M claims on 2M rows, first minute against last); buffers per claim bounded",
      unit: "last/first rate",
      higherIsBetter: true,
      noRatio: true,
      systems: await measure(contenders, 1, ctx.log),
      notes: [
        ...(missing ? [`scanfleet not measured: ${missing}`] : []),
        "one run per system; the value is the ratio of the last window's claim rate to the first's; buffers are pg_stat_statements shared blocks (hit + read) of the SKIP LOCKED claim statement per claimed target",
        "the raw SQL table has PostgreSQL's default autovacuum settings, as a user's own table would; scanfleet's has those of its migration 0003",
        ...(s.claims < 1_000_000 || s.rows < 2_000_000 ? ["short form (--quick): the goal's size is the full run's (2M rows, 1M claims, 10 s windows)"] : [])
      ]
    }
  ]
}
