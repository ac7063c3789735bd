/**
 * Workload 3: claims against a large targets table, comparing the claim rate and
 * the buffers read per claim of the first and the last window, and the worst
 * window's buffers (bounded or growing). The default is a short form that fits
 * the 15-minute budget; the goal's full size (1M claims against 2M rows, one-minute
 * windows) is `--only 3 --set soak.rows=2000000 --set soak.claims=1000000
 * --set soak.seconds=3000 --set soak.window=60`, where the run stops at whichever
 * of claims and seconds comes first.
 */
import { Effect } from "effect"
import pg from "pg"
import { loops, size, type Ctx } from "../Context.js"
import { measure, type Contender, type Sample, type WorkloadResult } from "../Report.js"
import * as Scanfleet from "../Scanfleet.js"

const DAY = 86_400_000

// Setup shared by both schemas: pending rows in one statement.
const seedSql = `
  INSERT INTO targets (source, identity, status, observed_remote_at, discovered_at)
  SELECT 'github', 'soak/' || i, 'pending', $1::bigint - ${DAY}, $1::bigint FROM generate_series(1, $2::int) AS i`

// Buffers touched by the claim statement so far (both claims lock with SKIP LOCKED).
const claimBuffers = `
  SELECT coalesce(sum(calls), 0)::float8 AS calls, coalesce(sum(shared_blks_hit + shared_blks_read), 0)::float8 AS blks
  FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1) AND query ILIKE '%SKIP LOCKED%'`

interface Shape {
  readonly rows: number
  /** Stop after this many claims (0: no limit) or `seconds`, whichever comes first. */
  readonly claims: number
  readonly seconds: number
  readonly windowSeconds: number
  readonly claimers: number
}

const soakRun = async (
  ctx: Ctx,
  s: Shape,
  prefix: string,
  open: (url: string) => Promise<{ prepare: (c: pg.Client) => Promise<void>; one: (i: number) => Promise<void>; close: () => Promise<void> }>
): Promise<Sample> => {
  const db = await ctx.pg.freshDb(prefix)
  const admin = new pg.Client({ connectionString: ctx.pg.url("postgres") })
  await admin.connect()
  const d = await open(db.url)
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
    let done = 0
    let last = { calls: 0, blks: 0 }
    const t0 = performance.now()
    const ticker = setInterval(async () => {
      counts.push(done)
      const r = (await admin.query(claimBuffers, [db.name])).rows[0]
      buffers.push((r.blks - last.blks) / Math.max(1, r.calls - last.calls))
      last = r
      const k = counts.length
      ctx.log(`      window ${k}: ${Math.round((done - (k > 1 ? counts[k - 2] : 0)) / s.windowSeconds)} claims/s, ${buffers[k - 1].toFixed(1)} buffers/claim, ${done.toLocaleString("en-US")} claims`)
    }, windowMs)
    const more = () => performance.now() - t0 < s.seconds * 1000 && (s.claims <= 0 || done < s.claims)
    await loops(s.claimers, async (i) => {
      while (more()) {
        await d.one(i)
        done++
      }
    })
    clearInterval(ticker)
    // Only whole windows count; a run shorter than two windows has no trend to show.
    if (counts.length < 2) throw new Error(`soak: ${counts.length} whole window(s) of ${s.windowSeconds} s; run longer or use a shorter soak.window`)
    const rates = counts.map((n, k) => (n - (k ? counts[k - 1] : 0)) / s.windowSeconds)
    const first = rates[0]
    const lastRate = rates[rates.length - 1]
    return {
      value: lastRate / first,
      extra: {
        "first window claims/s": first,
        "last window claims/s": lastRate,
        "first window buffers/claim": buffers[0],
        "last window buffers/claim": buffers[buffers.length - 1],
        "worst window buffers/claim": Math.max(...buffers),
        windows: counts.length,
        claims: done,
        seconds: (performance.now() - t0) / 1000
      }
    }
  } finally {
    await d.close()
    await admin.end()
    await ctx.pg.dropDb(db.name)
  }
}

/** Workload 3. */
export const soak = async (ctx: Ctx): Promise<Array<WorkloadResult>> => {
  const seconds = size(ctx, "soak.seconds", 6, 45)
  const s: Shape = {
    rows: size(ctx, "soak.rows", 100_000, 500_000),
    claims: size(ctx, "soak.claims", 0, 0),
    seconds,
    windowSeconds: size(ctx, "soak.window", seconds / 5, seconds / 5),
    claimers: 8
  }
  const withRaw = size(ctx, "soak.raw", 1, 1) !== 0
  const missing = await Scanfleet.pgMissing()
  const contenders: Array<Contender> = [
    ...(missing
      ? []
      : [
          {
            name: "scanfleet PgStore",
            note: `${s.claimers} devices of one slot, claim then submitResult`,
            run: () =>
              soakRun(ctx, s, "sf_soak", async (url) => {
                const sf = await Scanfleet.openPg(url, s.claimers + 2)
                const devices: Array<number> = []
                return {
                  prepare: async () => {
                    const now = Date.now()
                    for (let i = 0; i < s.claimers; i++) devices.push((await sf.run((st) => st.addDevice({ name: `soak-${i}`, slots: 1, tokenHash: `h${i}`, now }))).id)
                  },
                  one: (i) =>
                    sf.run((st) =>
                      Effect.gen(function* () {
                        const a = yield* st.claim({ deviceId: devices[i], slot: 0, now: Date.now(), config: Scanfleet.config })
                        if (a === null) throw new Error("backlog ran dry")
                        yield* st.submitResult({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: Date.now(), outcome: "clean", finalPhase: null, body: "{}" })
                      })
                    ),
                  close: () => sf.close()
                }
              })
          }
        ]),
    ...(withRaw ? [{
      name: "raw SQL (fenced SKIP LOCKED)",
      note: "the pattern of workload 1 on a table with scanfleet's target columns and pending index",
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
              const r = await pool.query(
                `WITH c AS (SELECT id FROM targets WHERE status = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
                 UPDATE targets t SET status = 'in_progress', fence = t.fence + 1, covered_remote_at = t.observed_remote_at, last_scan_started_at = $1
                 FROM c WHERE t.id = c.id RETURNING t.id, t.fence`,
                [Date.now()]
              )
              if (r.rowCount !== 1) throw new Error("backlog ran dry")
              await pool.query("UPDATE targets SET status = 'completed', completed_at = $3 WHERE id = $1 AND fence = $2 AND status = 'in_progress'", [r.rows[0].id, r.rows[0].fence, Date.now()])
            },
            close: () => pool.end()
          }
        })
    }] : [])
  ]
  return [
    {
      id: "3",
      title: `Soak: claim + complete against ${s.rows.toLocaleString("en-US")} pending targets, ${s.claims > 0 ? `${s.claims.toLocaleString("en-US")} claims or ` : ""}${s.seconds} s, ${s.claimers} claimers, windows of ${s.windowSeconds} s`,
      goal: "last window's rate >= 0.8x the first's (goal stated for 1M claims on 2M rows, one-minute windows); buffers per claim bounded",
      unit: "last/first rate",
      higherIsBetter: true,
      noRatio: true,
      systems: await measure(contenders, 1, ctx.log),
      notes: [
        ...(missing ? [`scanfleet not measured: ${missing}`] : []),
        "one run per system; the value is the ratio of the last window's claim rate to the first's; buffers are pg_stat_statements shared blocks (hit + read) of the SKIP LOCKED claim statement per call",
        "the raw SQL table has PostgreSQL's default autovacuum settings, as a user's own table would; scanfleet's has those of its migration 0003",
        ...(s.claims < 1_000_000 || s.rows < 2_000_000 ? ["short form: the goal's size is --set soak.rows=2000000 --set soak.claims=1000000 --set soak.seconds=3000 --set soak.window=60"] : [])
      ]
    }
  ]
}
