/**
 * Workload 6: duration percentiles. The same observations (seeded PRNG) over
 * 7 days, 4 sources, 5 metrics and 3 outcomes go to scanfleet's store and to a
 * plain table; a fixed set of queries (by source, metric, outcome and window)
 * is timed on both, and scanfleet's answers are compared with exact
 * `percentile_cont` over the plain table: counts must be equal, and the largest
 * relative error of a value is reported (scanfleet reads log-bucket counts).
 * Three of the windows cut hours and days at arbitrary points.
 */
import pg from "pg"
import { chunks, prng, since, size, type Ctx } from "../Context.js"
import { measure, meter, median, type Contender, type Sample, type WorkloadResult } from "../Report.js"
import * as Scanfleet from "../Scanfleet.js"

const DAY = 86_400_000
const sources = ["github", "gitlab", "huggingface", "dockerhub"] as const
const metrics = ["end_to_end", "scanning", "cleanup", "bundling", "upload"] as const
type Source = (typeof sources)[number]
type Metric = (typeof metrics)[number]
type Outcome = "clean" | "findings" | "scan_error"

interface D {
  readonly source: Source
  readonly metric: Metric
  readonly outcome: Outcome
  readonly ms: number
  readonly at: number
}

const scale: Record<Metric, number> = { end_to_end: 120_000, scanning: 60_000, cleanup: 2_000, bundling: 1_500, upload: 4_000 }

/** The observations, generated in chunks so that millions never sit in memory at once. */
function* generate(rows: number, end: number, chunk: number): Generator<Array<D>> {
  const rnd = prng(42)
  for (let done = 0; done < rows; done += chunk) {
    const out: Array<D> = []
    for (let i = 0; i < Math.min(chunk, rows - done); i++) {
      const metric = metrics[Math.floor(rnd() * metrics.length)]
      const u = rnd()
      const outcome: Outcome = u < 0.8 ? "clean" : u < 0.95 ? "findings" : "scan_error"
      // log-normal around the metric's scale (Box-Muller)
      const z = Math.sqrt(-2 * Math.log(1 - rnd())) * Math.cos(2 * Math.PI * rnd())
      out.push({ source: sources[Math.floor(rnd() * sources.length)], metric, outcome, ms: Math.max(1, Math.round(scale[metric] * Math.exp(0.8 * z))), at: end - Math.floor(rnd() * 7 * DAY) })
    }
    yield out
  }
}

interface Query {
  readonly label: string
  readonly from: number
  readonly to: number
  readonly source?: Source
  readonly metric?: Metric
  readonly outcome?: Outcome
}

const queries = (end: number): Array<Query> => [
  ...sources.map((source) => ({ label: `${source} end_to_end 24h`, from: end - DAY, to: end, source, metric: "end_to_end" as const })),
  ...sources.map((source) => ({ label: `${source} all metrics 7d`, from: end - 7 * DAY, to: end, source })),
  { label: "github scanning clean 1h", from: end - 3_600_000, to: end, source: "github", metric: "scanning", outcome: "clean" },
  { label: "everything 7d", from: end - 7 * DAY, to: end },
  { label: "everything 24h", from: end - DAY, to: end },
  // windows that cut hours and days at arbitrary points, as "the last 24 hours" does
  { label: "everything 24h unaligned", from: end - DAY - 1_234_567, to: end - 1_234_567 },
  { label: "everything 7d unaligned", from: end - 7 * DAY + 2_345_678, to: end - 1_234_567 },
  { label: "dockerhub all metrics 7d unaligned", from: end - 7 * DAY + 2_345_678, to: end - 1_234_567, source: "dockerhub" }
]

interface Row {
  readonly key: string
  readonly count: number
  readonly p: readonly [number, number, number]
}

interface Driver {
  readonly insert: (ds: ReadonlyArray<D>) => Promise<void>
  readonly query: (q: Query) => Promise<Array<Row>>
  readonly close: () => Promise<void>
}

const rowKey = (r: { source: string; metric: string; outcome: string }) => `${r.source}/${r.metric}/${r.outcome}`

const scanfleetDriver = async (url: string): Promise<Driver> => {
  const sf = await Scanfleet.openPg(url, 2)
  const value = (q: { status: string; value?: number }) => (q.status === "ok" ? (q.value as number) : NaN)
  return {
    insert: (ds) => sf.run((st) => st.recordDurations(ds)),
    query: async (q) =>
      (await sf.run((st) => st.percentiles({ from: q.from, to: q.to, source: q.source, metric: q.metric, outcome: q.outcome, minSamples: 1 }))).map((r) => ({
        key: rowKey(r),
        count: r.count,
        p: [value(r.p50 as never), value(r.p95 as never), value(r.p99 as never)] as const
      })),
    close: () => sf.close()
  }
}

const rawDriver = async (url: string): Promise<Driver> => {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  await c.query(`
    CREATE TABLE durations (source TEXT NOT NULL, metric TEXT NOT NULL, outcome TEXT NOT NULL, ms DOUBLE PRECISION NOT NULL, at BIGINT NOT NULL);
    CREATE INDEX durations_idx ON durations (source, metric, outcome, at);
    CREATE INDEX durations_at_idx ON durations (at);`)
  return {
    insert: async (ds) => {
      await c.query("INSERT INTO durations SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[], $5::bigint[])", [
        ds.map((d) => d.source),
        ds.map((d) => d.metric),
        ds.map((d) => d.outcome),
        ds.map((d) => d.ms),
        ds.map((d) => d.at)
      ])
    },
    query: async (q) => {
      const where = ["at >= $1", "at < $2"]
      const params: Array<unknown> = [q.from, q.to]
      for (const [col, v] of [["source", q.source], ["metric", q.metric], ["outcome", q.outcome]] as const)
        if (v !== undefined) {
          params.push(v)
          where.push(`${col} = $${params.length}`)
        }
      const r = await c.query(
        `SELECT source, metric, outcome, count(*)::int AS n, percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY ms) AS p
         FROM durations WHERE ${where.join(" AND ")} GROUP BY source, metric, outcome`,
        params
      )
      return r.rows.map((x) => ({ key: rowKey(x), count: x.n, p: [x.p[0], x.p[1], x.p[2]] as const }))
    },
    close: () => c.end()
  }
}

interface Shape {
  readonly rows: number
  readonly repeats: number
}

let exact: Map<string, Map<string, Row>> | null = null

const run = async (ctx: Ctx, s: Shape, open: (url: string) => Promise<Driver>, prefix: string, isExact: boolean): Promise<Sample> => {
  const db = await ctx.pg.freshDb(prefix)
  const d = await open(db.url)
  try {
    const end = Date.UTC(2026, 0, 8)
    const t0 = performance.now()
    // 10,000 rows a call, like discovery's batches
    for (const c of generate(s.rows, end, 10_000)) await d.insert(c)
    const ingestSecs = since(t0)
    await ctx.pg.analyze(db.name)
    const qs = queries(end)
    const perQuery: Array<number> = []
    const answers = new Map<string, Map<string, Row>>()
    await ctx.pg.resetStatements()
    const costs = await meter(ctx.pg)
    for (const q of qs) {
      const ms: Array<number> = []
      for (let k = 0; k < s.repeats; k++) {
        const t = performance.now()
        const rows = await d.query(q)
        ms.push(performance.now() - t)
        answers.set(q.label, new Map(rows.map((r) => [r.key, r])))
      }
      perQuery.push(median(ms))
    }
    // per query
    const cost = await costs.end(qs.length * s.repeats)
    const stmts = await ctx.pg.statements(db.name)
    const extra: Record<string, number> = { "worst query ms": Math.max(...perQuery), "ingest rows/s": s.rows / ingestSecs }
    qs.forEach((q, i) => (extra[`${q.label} ms`] = perQuery[i]))
    if (isExact) exact = answers
    else if (exact) {
      // relative error against exact percentile_cont, over every group of every query
      let worst = 0
      let groups = 0
      for (const [label, rows] of exact) {
        const mine = answers.get(label)
        for (const [k, r] of rows) {
          const m = mine?.get(k)
          if (!m || m.count !== r.count) throw new Error(`verification: ${label} ${k}: count ${m?.count} vs exact ${r.count}`)
          for (let i = 0; i < 3; i++) worst = Math.max(worst, Math.abs(m.p[i] - r.p[i]) / r.p[i])
          groups++
        }
      }
      extra["max relative error %"] = 100 * worst
      extra["groups compared"] = groups
    }
    return { value: median(perQuery), statementsPerUnit: stmts / (qs.length * s.repeats), ...cost, extra }
  } finally {
    await d.close()
    await ctx.pg.dropDb(db.name)
  }
}

/** Workload 6. */
export const query = async (ctx: Ctx): Promise<Array<WorkloadResult>> => {
  const s: Shape = { rows: size(ctx, "percentiles.rows", 100_000, 500_000), repeats: 3 }
  const missing = await Scanfleet.pgMissing()
  exact = null
  const contenders: Array<Contender> = [
    // the exact answer runs first in every round, so scanfleet's run can be compared with it
    {
      name: "raw SQL (exact percentile_cont)",
      note: "plain table with an index on (source, metric, outcome, at); percentile_cont(ARRAY[0.5, 0.95, 0.99]) grouped",
      run: () => run(ctx, s, rawDriver, "raw_pct", true)
    },
    ...(missing ? [] : [{ name: "scanfleet PgStore", note: "Store.recordDurations in batches of 10,000 (a trigger upserts the log-bucket rollups); Store.percentiles with minSamples 1 (day, six-hour, hour and ten-minute rollups plus raw rows at the window's edges; within 0.9% of exact)", run: () => run(ctx, s, scanfleetDriver, "sf_pct", false) }])
  ]
  return [
    {
      id: "6",
      title: `Percentiles: ${s.rows.toLocaleString("en-US")} duration observations over 7 days, 4 sources, 5 metrics, 3 outcomes; ${queries(0).length} queries, median of ${s.repeats} each`,
      goal: "<= 50 ms per query (10M observations), within 1% relative error of exact percentile_cont",
      unit: "ms/query (median over queries)",
      higherIsBetter: false,
      systems: await measure(contenders, ctx.runs, ctx.log),
      notes: [
        ...(missing ? [`scanfleet not measured: ${missing}`] : []),
        `the goal names 10M observations; this run used ${s.rows.toLocaleString("en-US")} (\`--set percentiles.rows=10000000\` for the full size)`,
        "stmts/unit here is statements per query"
      ]
    }
  ]
}
