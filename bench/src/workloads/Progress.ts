/**
 * Workload 5: progress ingest. Concurrent streams (one per reservation) send
 * batches of 100 or 1,000 events, with 0 % or 50 % of each batch being a resend
 * of events already accepted. Afterwards every reservation's timeline must hold
 * exactly one event per sequence number.
 */
import { Effect } from "effect"
import pg from "pg"
import { loops, since, size, type Ctx } from "../Context.js"
import { measure, meter, type Contender, type Sample, type WorkloadResult } from "../Report.js"
import * as Scanfleet from "../Scanfleet.js"

const stagePhases = ["assigned", "permit_wait", "preparing", "acquiring", "scanning", "filtering", "cleanup", "staging"] as const

/** The event with sequence `seq`: the scan stage's phases in order, then `recovered` events (legal: they repeat the current phase). */
export const event = (seq: number, at0: number) =>
  seq <= stagePhases.length
    ? { seq, kind: "phase" as const, phase: stagePhases[seq - 1], at: at0 + seq, detail: "bench" }
    : { seq, kind: "recovered" as const, phase: "staging" as const, at: at0 + seq, detail: "bench" }

type Ev = ReturnType<typeof event>

interface Combo {
  readonly batch: number
  readonly dupPercent: 0 | 50
}

interface Shape {
  readonly streams: number
  /** Events submitted per combination and run, all streams together. */
  readonly events: number
}

/**
 * The batches one stream sends: with 50 % duplicates, each batch after the
 * first starts with the second half of the previous batch again.
 */
const plan = (perStream: number, c: Combo): Array<Array<number>> => {
  const out: Array<Array<number>> = []
  const fresh = c.dupPercent === 50 ? c.batch / 2 : c.batch
  let next = 1
  let sent = 0
  while (sent < perStream) {
    const dup = c.dupPercent === 50 && next > 1 ? Array.from({ length: c.batch / 2 }, (_, i) => next - c.batch / 2 + i).filter((s) => s >= 1) : []
    const n = Math.min(fresh, Math.max(1, perStream - sent - dup.length))
    const seqs = [...dup, ...Array.from({ length: n }, (_, i) => next + i)]
    next += n
    sent += seqs.length
    out.push(seqs)
  }
  return out
}

interface Driver {
  /** Opens one reservation per stream; returns an append function per stream and the timeline reader. */
  readonly open: (streams: number) => Promise<Array<{ append: (events: ReadonlyArray<Ev>) => Promise<{ accepted: number; duplicate: number }>; seqs: () => Promise<Array<number>> }>>
  readonly close: () => Promise<void>
}

const scanfleetDriver = async (url: string, streams: number): Promise<Driver> => {
  const sf = await Scanfleet.openPg(url, streams + 2)
  let seeded = 0
  return {
    open: async (n) => {
      const now = Date.now()
      const device = await sf.run((st) => st.addDevice({ name: `bench-${seeded}`, slots: n, tokenHash: `hash-${seeded}`, now }))
      await sf.run((st) => st.recordObservations(Array.from({ length: n }, (_, i) => ({ source: "github" as const, identity: `p/${seeded}-${i}`, remoteAt: null })), now))
      seeded++
      const claims = await sf.run((st) =>
        Effect.forEach(Array.from({ length: n }, (_, slot) => slot), (slot) => st.claim({ deviceId: device.id, slot, now, config: Scanfleet.config }))
      )
      return claims.map((a) => {
        if (a === null) throw new Error("nothing to claim")
        return {
          append: async (events) => {
            const r = await sf.run((st) => st.appendProgress({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: Date.now() }, events))
            let accepted = 0
            for (const x of r.results) if (x.status === "accepted") accepted++
            return { accepted, duplicate: r.results.length - accepted }
          },
          seqs: async () => (await sf.run((st) => st.timeline(a.reservationId))).map((e) => e.seq)
        }
      })
    },
    close: () => sf.close()
  }
}

const rawSchema = `
  CREATE TABLE reservations (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, fence INTEGER NOT NULL, state TEXT NOT NULL, last_seq INTEGER NOT NULL DEFAULT 0, last_progress_at BIGINT);
  CREATE TABLE progress (
    reservation_id BIGINT NOT NULL REFERENCES reservations (id), seq INTEGER NOT NULL, kind TEXT NOT NULL, phase TEXT NOT NULL,
    at BIGINT NOT NULL, detail TEXT, accepted_at BIGINT NOT NULL, PRIMARY KEY (reservation_id, seq));`

// One statement: fenced ownership check, idempotent insert, last-seq bump, and
// the original acceptance of every duplicate. No phase-model validation.
const rawAppend = `
  WITH r AS (SELECT id FROM reservations WHERE id = $1 AND fence = $2 AND state = 'active'),
  ins AS (
    INSERT INTO progress (reservation_id, seq, kind, phase, at, detail, accepted_at)
    SELECT r.id, e.seq, e.kind, e.phase, e.at, e.detail, $3::bigint
    FROM r, unnest($4::int[], $5::text[], $6::text[], $7::bigint[], $8::text[]) AS e(seq, kind, phase, at, detail)
    ON CONFLICT (reservation_id, seq) DO NOTHING
    RETURNING seq, accepted_at),
  upd AS (
    UPDATE reservations SET last_seq = GREATEST(last_seq, (SELECT max(seq) FROM ins)), last_progress_at = $3::bigint
    WHERE id = $1 AND EXISTS (SELECT 1 FROM ins))
  SELECT seq, accepted_at, true AS accepted FROM ins
  UNION ALL
  SELECT p.seq, p.accepted_at, false FROM progress p, r WHERE p.reservation_id = r.id AND p.seq = ANY($4::int[])`

const rawDriver = async (url: string, streams: number): Promise<Driver> => {
  const pool = new pg.Pool({ connectionString: url, max: streams })
  pool.on("error", () => {})
  await pool.query(rawSchema)
  return {
    open: async (n) => {
      const r = await pool.query("INSERT INTO reservations (fence, state) SELECT 1, 'active' FROM generate_series(1, $1) RETURNING id", [n])
      return r.rows.map(({ id }) => ({
        append: async (events) => {
          const x = await pool.query(rawAppend, [
            id,
            1,
            Date.now(),
            events.map((e) => e.seq),
            events.map((e) => e.kind),
            events.map((e) => e.phase),
            events.map((e) => e.at),
            events.map((e) => e.detail)
          ])
          if (x.rowCount !== events.length) throw new Error(`raw append answered ${x.rowCount} of ${events.length} events`)
          const accepted = x.rows.filter((y) => y.accepted).length
          return { accepted, duplicate: events.length - accepted }
        },
        seqs: async () => (await pool.query("SELECT seq FROM progress WHERE reservation_id = $1 ORDER BY seq", [id])).rows.map((y) => y.seq as number)
      }))
    },
    close: () => pool.end()
  }
}

const combos: ReadonlyArray<Combo> = [
  { batch: 100, dupPercent: 0 },
  { batch: 100, dupPercent: 50 },
  { batch: 1000, dupPercent: 0 },
  { batch: 1000, dupPercent: 50 }
]
const key = (c: Combo) => `batch ${c.batch}, ${c.dupPercent}% dup`

const run = async (ctx: Ctx, s: Shape, open: (url: string) => Promise<Driver>, prefix: string): Promise<Sample> => {
  const db = await ctx.pg.freshDb(prefix)
  const d = await open(db.url)
  try {
    const extra: Record<string, number> = {}
    let profile: Sample["profile"]
    for (const c of combos) {
      const streams = await d.open(s.streams)
      await ctx.pg.analyze(db.name)
      const perStream = Math.ceil(s.events / s.streams)
      const at0 = Date.now()
      let submitted = 0
      let accepted = 0
      let calls = 0
      await ctx.pg.resetStatements()
      const costs = await meter(ctx.pg)
      const t0 = performance.now()
      await loops(s.streams, async (i) => {
        for (const seqs of plan(perStream, c)) {
          const r = await streams[i].append(seqs.map((q) => event(q, at0)))
          submitted += seqs.length
          accepted += r.accepted
          calls++
        }
      })
      const secs = since(t0)
      // each combination's costs per submitted event, for its table
      const cost = await costs.end(submitted)
      extra[`${key(c)}: client µs`] = cost.cpu!.clientMicros
      extra[`${key(c)}: server µs`] = cost.cpu!.serverMicros
      extra[`${key(c)}: WAL bytes`] = cost.walPerUnit!
      const stmts = await ctx.pg.statements(db.name)
      if (c === combos[0]) profile = await ctx.pg.profile(db.name, calls)
      // exactly one row per (reservation, sequence), none missing
      let unique = 0
      for (const st of streams) {
        const seqs = await st.seqs()
        for (let k = 0; k < seqs.length; k++) if (seqs[k] !== k + 1) throw new Error(`verification: timeline has seq ${seqs[k]} at position ${k + 1}`)
        unique += seqs.length
      }
      if (unique !== accepted) throw new Error(`verification: ${unique} stored events, ${accepted} accepted`)
      extra[`${key(c)}: events/s`] = submitted / secs
      extra[`${key(c)}: stmts/call`] = stmts / calls
    }
    const first = combos[0]
    return { value: extra[`${key(first)}: events/s`], statementsPerUnit: extra[`${key(first)}: stmts/call`], extra, profile }
  } finally {
    await d.close()
    await ctx.pg.dropDb(db.name)
  }
}

/** Workload 5 as one table per combination of batch size and duplicate share. */
export const ingest = async (ctx: Ctx): Promise<Array<WorkloadResult>> => {
  const s: Shape = { streams: 8, events: size(ctx, "progress.events", 8_000, 80_000) }
  const missing = await Scanfleet.pgMissing()
  const contenders: Array<Contender> = [
    ...(missing ? [] : [{ name: "scanfleet PgStore", note: "Store.appendProgress per batch (phase model checked, fenced, idempotent)", run: () => run(ctx, s, (u) => scanfleetDriver(u, s.streams), "sf_prog") }]),
    {
      name: "raw SQL (unnest, ON CONFLICT DO NOTHING)",
      note: "one statement per batch: fenced ownership check, idempotent insert, duplicates' original acceptance; no phase-model validation",
      run: () => run(ctx, s, (u) => rawDriver(u, s.streams), "raw_prog")
    }
  ]
  const systems = await measure(contenders, ctx.runs, ctx.log)
  return combos.map((c) => ({
    id: `5.${c.batch}.${c.dupPercent}`,
    title: `Progress ingest: ${s.streams} concurrent reservations, batches of ${c.batch}, ${c.dupPercent}% duplicates, ${s.events.toLocaleString("en-US")} events submitted per run`,
    goal: ">= 30k events/s, exactly one row per (reservation, sequence)",
    unit: "events/s",
    higherIsBetter: true,
    systems: systems.map((sys) => ({
      ...sys,
      samples: sys.samples.map((x) => ({
        value: Number(x.extra?.[`${key(c)}: events/s`]),
        statementsPerUnit: Number(x.extra?.[`${key(c)}: stmts/call`]),
        cpu: { clientMicros: Number(x.extra?.[`${key(c)}: client µs`]), serverMicros: Number(x.extra?.[`${key(c)}: server µs`]) },
        walPerUnit: Number(x.extra?.[`${key(c)}: WAL bytes`]),
        profile: c === combos[0] ? x.profile : undefined
      }))
    })),
    notes: c.batch === 100 && c.dupPercent === 0 ? [...(missing ? [`scanfleet not measured: ${missing}`] : []), "stmts/unit here is statements per batch call; every run verified one stored event per sequence number, none missing"] : []
  }))
}
