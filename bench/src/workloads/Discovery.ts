/**
 * Workload 4: discovery. A cycle records N observations of known, completed
 * targets, 0 %, 10 % or 100 % of them newer than what was covered, in batches
 * through one call each; then the budgeted promotion. The promotion is also
 * timed on a table several times larger, to show whether its cost follows the
 * budget or the table.
 */
import { Effect } from "effect"
import pg from "pg"
import { chunks, since, size, type Ctx } from "../Context.js"
import { measure, meter, median, type Contender, type Sample, type SystemResult, type WorkloadResult } from "../Report.js"
import * as Scanfleet from "../Scanfleet.js"

const DAY = 86_400_000
const passes = [0, 10, 100] as const

interface Shape {
  readonly rows: number
  readonly batch: number
  readonly budget: number
  readonly cooldownMs: number
  /** Promotions timed after the 100 % pass. */
  readonly promotions: number
}

/** What one system must offer: record a batch (one call), promote, and the bulk "every target was scanned" setup. */
interface Driver {
  readonly record: (batch: ReadonlyArray<{ identity: string; remoteAt: number }>, now: number) => Promise<number>
  readonly promote: (now: number) => Promise<number>
  /** Setup, not measured: marks every target completed as if scanned 5 days ago, covering what was observed. */
  readonly completeAll: (now: number) => Promise<void>
  readonly close: () => Promise<void>
}

// Setup shared by both: the two schemas have the same target columns.
const completeAllSql = `
  UPDATE targets SET status = 'completed', covered_remote_at = observed_remote_at, fence = fence + 1,
    completed_at = $1::bigint, last_scan_started_at = $1::bigint - (id % 1000) * 1000`

const scanfleetDriver = async (url: string, s: Shape): Promise<Driver> => {
  const sf = await Scanfleet.openPg(url, 2)
  const admin = new pg.Client({ connectionString: url })
  await admin.connect()
  return {
    record: async (batch, now) => {
      const r = await sf.run((st) => st.recordObservations(batch.map((b) => ({ source: "github" as const, identity: b.identity, remoteAt: b.remoteAt })), now))
      return r.inserted.length
    },
    promote: async (now) => (await sf.run((st) => st.promote("github", { budget: s.budget, cooldownMs: s.cooldownMs }, now))).promoted.length,
    completeAll: async (now) => {
      await admin.query(completeAllSql, [now])
    },
    close: async () => {
      await admin.end()
      await sf.close()
    }
  }
}

const rawSchema = `
  CREATE TABLE targets (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source TEXT NOT NULL,
    identity TEXT NOT NULL,
    status TEXT NOT NULL,
    observed_remote_at BIGINT,
    covered_remote_at BIGINT,
    completed_at BIGINT,
    last_scan_started_at BIGINT,
    fence INTEGER NOT NULL DEFAULT 0,
    discovered_at BIGINT NOT NULL,
    UNIQUE (source, identity)
  );
  CREATE INDEX targets_pending_idx ON targets (id) WHERE status = 'pending';
  CREATE INDEX targets_promotion_idx ON targets (source, (COALESCE(last_scan_started_at, completed_at, 0)), id)
    WHERE status = 'completed' AND observed_remote_at IS NOT NULL;`

// The shape of scanfleet's statement (tenth and seventeenth rounds): each identity looked up by the unique
// index (a lateral probe: a join is planned as a hash over the whole table), a known one whose observation is
// newer updated by its id, and only unknown identities handed to the INSERT ... ON CONFLICT (given every row,
// ON CONFLICT would lock every known row and draw an id for each; given the newer known ones, it probes the
// unique index again and logs a lock before each update).
const rawRecord = `
  WITH i AS MATERIALIZED (
    SELECT u.identity, u.remote_at, u.ord, k.id AS known_id, k.observed_remote_at AS known_at
    FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS u(identity, remote_at, ord)
    LEFT JOIN LATERAL (
      SELECT t.id, t.observed_remote_at FROM targets t WHERE t.source = 'github' AND t.identity = u.identity OFFSET 0
    ) AS k ON true
  ), newer AS (
    UPDATE targets t SET observed_remote_at = GREATEST(t.observed_remote_at, i.remote_at)
    FROM i
    WHERE t.id = ANY (ARRAY(SELECT i.known_id FROM i WHERE i.remote_at IS NOT NULL AND (i.known_at IS NULL OR i.remote_at > i.known_at)))
      AND i.known_id = t.id AND (t.observed_remote_at IS NULL OR i.remote_at > t.observed_remote_at)
  )
  INSERT INTO targets (id, source, identity, status, observed_remote_at, discovered_at) OVERRIDING SYSTEM VALUE
  SELECT nextval('targets_id_seq'::regclass), 'github', i.identity, 'pending', i.remote_at, $3::bigint
  FROM i
  WHERE i.known_id IS NULL
  ORDER BY i.ord
  ON CONFLICT (source, identity) DO UPDATE
    SET observed_remote_at = GREATEST(targets.observed_remote_at, EXCLUDED.observed_remote_at)
    WHERE EXCLUDED.observed_remote_at IS NOT NULL
      AND (targets.observed_remote_at IS NULL OR EXCLUDED.observed_remote_at > targets.observed_remote_at)
  RETURNING identity, (xmax = 0) AS inserted`

const eligible = `
  source = 'github' AND status = 'completed' AND observed_remote_at IS NOT NULL
  AND observed_remote_at > COALESCE(covered_remote_at, completed_at)
  AND COALESCE(last_scan_started_at, completed_at, 0) <= $1::bigint - $2::bigint`

const rawPromote = (countDeferred: boolean) => `
  WITH picked AS (
    SELECT id, fence FROM targets WHERE ${eligible}
    ORDER BY COALESCE(last_scan_started_at, completed_at, 0), id
    LIMIT $3 FOR UPDATE SKIP LOCKED
  ), moved AS (
    UPDATE targets t SET status = 'pending', fence = t.fence + 1
    FROM picked p WHERE t.id = p.id AND t.status = 'completed' AND t.fence = p.fence
    RETURNING t.identity
  )
  SELECT (SELECT count(*) FROM moved) AS moved${countDeferred ? `, (SELECT count(*) FROM targets WHERE ${eligible}) AS eligible` : ""}`

const rawDriver = async (url: string, s: Shape, countDeferred: boolean): Promise<Driver> => {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  await c.query(rawSchema)
  return {
    record: async (batch, now) => {
      const r = await c.query(rawRecord, [batch.map((b) => b.identity), batch.map((b) => b.remoteAt), now])
      return r.rows.filter((x) => x.inserted).length
    },
    promote: async (now) => Number((await c.query(rawPromote(countDeferred), [now, s.cooldownMs, s.budget])).rows[0].moved),
    completeAll: async (now) => {
      await c.query(completeAllSql, [now])
    },
    close: () => c.end()
  }
}

const identity = (i: number) => `org-${i % 997}/repo-${i}`

/** One run: seed N targets, complete them, run the three passes and the promotions. */
const cycleRun = async (ctx: Ctx, s: Shape, open: (url: string) => Promise<Driver>, prefix: string): Promise<Sample> => {
  const db = await ctx.pg.freshDb(prefix)
  const d = await open(db.url)
  try {
    const now0 = Date.now()
    const seedAt = (i: number) => now0 - 10 * DAY + i
    const ids = Array.from({ length: s.rows }, (_, i) => i)
    // seeding is itself a pass: every observation new
    const tSeed = performance.now()
    let inserted = 0
    for (const c of chunks(ids, s.batch)) inserted += await d.record(c.map((i) => ({ identity: identity(i), remoteAt: seedAt(i) })), now0)
    const seedSecs = since(tSeed)
    if (inserted !== s.rows) throw new Error(`verification: ${inserted} inserted, expected ${s.rows}`)
    await d.completeAll(now0 - 5 * DAY)
    await ctx.pg.analyze(db.name)
    const extra: Record<string, number> = { "new obs/s (seeding)": s.rows / seedSecs }
    for (const p of passes) {
      const newer = (i: number) => (p === 100 ? true : p === 10 ? i % 10 === 0 : false)
      await ctx.pg.resetStatements()
      const costs = await meter(ctx.pg)
      const t0 = performance.now()
      for (const c of chunks(ids, s.batch))
        await d.record(c.map((i) => ({ identity: identity(i), remoteAt: newer(i) ? now0 - DAY + p : seedAt(i) })), now0)
      const secs = since(t0)
      // each pass's costs per observation, for its table
      const cost = await costs.end(s.rows)
      extra[`${p}% newer: client µs`] = cost.cpu!.clientMicros
      extra[`${p}% newer: server µs`] = cost.cpu!.serverMicros
      extra[`${p}% newer: WAL bytes`] = cost.walPerUnit!
      const stmts = await ctx.pg.statements(db.name)
      extra[`${p}% newer: obs/s`] = s.rows / secs
      extra[`${p}% newer: stmts/batch`] = stmts / Math.ceil(s.rows / s.batch)
    }
    // every target is now eligible: promotion at its worst case, timed one call at a time
    const ms: Array<number> = []
    await ctx.pg.resetStatements()
    for (let k = 0; k < s.promotions; k++) {
      const t0 = performance.now()
      const moved = await d.promote(now0)
      ms.push(performance.now() - t0)
      if (moved !== s.budget) throw new Error(`verification: promotion moved ${moved}, expected the budget ${s.budget}`)
    }
    extra["promotion ms"] = median(ms)
    extra["promotion stmts/call"] = (await ctx.pg.statements(db.name)) / s.promotions
    return { value: extra["10% newer: obs/s"], statementsPerUnit: extra["10% newer: stmts/batch"], extra }
  } finally {
    await d.close()
    await ctx.pg.dropDb(db.name)
  }
}

/**
 * Promotion alone on a table of `rows` targets, all eligible. The table is
 * filled by one INSERT ... SELECT generate_series (setup, not measured; both
 * schemas share these columns), so that millions of rows take seconds.
 */
const seedSql = `
  INSERT INTO targets (source, identity, status, observed_remote_at, covered_remote_at, completed_at, last_scan_started_at, fence, discovered_at)
  SELECT 'github', 'org-' || (i % 997) || '/repo-' || i, 'completed', $1::bigint - ${DAY}, $1::bigint - ${10 * DAY} + i,
         $1::bigint - ${5 * DAY}, $1::bigint - ${5 * DAY} - (i % 1000) * 1000, 1, $1::bigint
  FROM generate_series(0, $2::int - 1) AS i`

const promotionRun = async (ctx: Ctx, s: Shape, open: (url: string) => Promise<Driver>, prefix: string): Promise<Sample> => {
  const db = await ctx.pg.freshDb(prefix)
  const d = await open(db.url)
  try {
    const now0 = Date.now()
    const c = new pg.Client({ connectionString: db.url })
    await c.connect()
    await c.query(seedSql, [now0, s.rows])
    await c.end()
    await ctx.pg.analyze(db.name)
    const ms: Array<number> = []
    await ctx.pg.resetStatements()
    const costs = await meter(ctx.pg)
    for (let k = 0; k < s.promotions; k++) {
      const t0 = performance.now()
      const moved = await d.promote(now0)
      ms.push(performance.now() - t0)
      if (moved !== s.budget) throw new Error(`verification: promotion moved ${moved}, expected the budget ${s.budget}`)
    }
    // per promotion call
    return { value: median(ms), statementsPerUnit: (await ctx.pg.statements(db.name)) / s.promotions, ...(await costs.end(s.promotions)) }
  } finally {
    await d.close()
    await ctx.pg.dropDb(db.name)
  }
}

// A pass's costs, recorded under its key's prefix, as a table's cost columns (absent when not measured).
const costsOf = (x: Sample, prefix: string): Pick<Sample, "cpu" | "walPerUnit"> =>
  x.extra?.[`${prefix}client µs`] === undefined
    ? {}
    : { cpu: { clientMicros: Number(x.extra[`${prefix}client µs`]), serverMicros: Number(x.extra[`${prefix}server µs`]) }, walPerUnit: Number(x.extra[`${prefix}WAL bytes`]) }

const pick = (systems: ReadonlyArray<SystemResult>, key: string, stmtsKey?: string): Array<SystemResult> =>
  systems.map((s) => ({
    ...s,
    samples: s.samples.map((x) => ({
      value: Number(x.extra?.[key]),
      statementsPerUnit: stmtsKey ? Number(x.extra?.[stmtsKey]) : undefined,
      ...costsOf(x, key.replace(/obs\/s$/, ""))
    }))
  }))

/** Workload 4, as several tables: recording at 0/10/100 % newer, promotion at two table sizes. */
export const discovery = async (ctx: Ctx): Promise<Array<WorkloadResult>> => {
  const cfg = Scanfleet.config.sources.github
  const base: Shape = {
    rows: size(ctx, "discovery.rows", 20_000, 200_000),
    batch: size(ctx, "discovery.batch", 10_000, 10_000),
    budget: cfg.promotionBudget,
    cooldownMs: cfg.cooldownSeconds * 1000,
    promotions: 5
  }
  const large: Shape = { ...base, rows: size(ctx, "discovery.largeRows", 200_000, 1_000_000) }
  const missing = await Scanfleet.pgMissing()
  const notes = missing ? [`scanfleet not measured: ${missing}`] : []
  const cycle: Array<Contender> = [
    ...(missing ? [] : [{ name: "scanfleet PgStore", note: "Store.recordObservations per batch, then Store.promote", run: () => cycleRun(ctx, base, (u) => scanfleetDriver(u, base), "sf_disc") }]),
    {
      name: "raw SQL (unnest upsert)",
      note: "one statement: each identity probed by the unique index (LATERAL), the new and the newer given to INSERT ... ON CONFLICT DO UPDATE SET GREATEST(...) RETURNING (xmax = 0), a known one with its own id; promotion with SKIP LOCKED and the deferred count",
      run: () => cycleRun(ctx, base, (u) => rawDriver(u, base, true), "raw_disc")
    }
  ]
  ctx.log(`  cycles of ${base.rows.toLocaleString("en-US")} observations`)
  const systems = await measure(cycle, ctx.runs, ctx.log)
  const rec = (p: number): WorkloadResult => ({
    id: `4.${p}`,
    title: `Discovery: record ${base.rows.toLocaleString("en-US")} observations of known completed targets, ${p}% newer, batches of ${base.batch.toLocaleString("en-US")}`,
    goal: p === 10 ? ">= 100k observations/s, one statement per batch" : p === 100 ? ">= 50k observations/s, one statement per batch" : "one statement per batch",
    unit: "obs/s",
    higherIsBetter: true,
    systems: pick(systems, `${p}% newer: obs/s`, `${p}% newer: stmts/batch`),
    notes: p === 0 ? [...notes, "stmts/unit here is statements per batch", "seeding (all new): " + systems.map((s) => `${s.system} ${Math.round(median(s.samples.map((x) => Number(x.extra?.["new obs/s (seeding)"]))))} obs/s`).join("; ")] : ["stmts/unit here is statements per batch"]
  })
  const promoAt: WorkloadResult = {
    id: "4.p",
    title: `Discovery: budgeted promotion (budget ${base.budget}) with all ${base.rows.toLocaleString("en-US")} targets eligible`,
    goal: "one promotion statement; cost O(budget), independent of table size",
    unit: "ms/promotion",
    higherIsBetter: false,
    systems: pick(systems, "promotion ms", "promotion stmts/call"),
    notes: ["stmts/unit here is statements per promotion call"]
  }
  ctx.log(`  promotion on ${large.rows.toLocaleString("en-US")} targets`)
  const largeRuns = 1
  const big = await measure(
    [
      ...(missing ? [] : [{ name: "scanfleet PgStore", run: () => promotionRun(ctx, large, (u) => scanfleetDriver(u, large), "sf_promo") }]),
      { name: "raw SQL (no deferred count)", run: () => promotionRun(ctx, large, (u) => rawDriver(u, large, false), "raw_promo_nc") },
      { name: "raw SQL (exact deferred count)", run: () => promotionRun(ctx, large, (u) => rawDriver(u, large, true), "raw_promo_c") }
    ],
    largeRuns,
    ctx.log
  )
  const promoLarge: WorkloadResult = {
    id: "4.P",
    title: `Discovery: budgeted promotion (budget ${base.budget}) with all ${large.rows.toLocaleString("en-US")} targets eligible (${largeRuns} run)`,
    goal: `about the same ms as at ${base.rows.toLocaleString("en-US")} targets (O(budget))`,
    unit: "ms/promotion",
    higherIsBetter: false,
    systems: big,
    notes: [
      "Store.promote returns `deferred` (eligible but left by the budget) counted up to Promotion.deferredCountLimit (10,000; at the limit it reads \"at least\"), so it reads at most budget + 10,000 index entries; the raw SQL is shown without a count and with an exact count(*) of every eligible row"
    ]
  }
  return [rec(0), rec(10), rec(100), promoAt, promoLarge]
}
