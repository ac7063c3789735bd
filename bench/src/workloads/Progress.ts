/**
 * Workload 5: progress ingest. Concurrent streams send batches of 100 or 1,000
 * events, with 0 % or 50 % of each batch being a resend of events already
 * accepted; each stream moves to a fresh reservation when a timeline is full
 * (PhaseModel.maxSeq events). Afterwards every reservation's timeline must hold
 * exactly one event per sequence number.
 */
import { PhaseModel } from "@scanfleet/core"
import { Effect } from "effect"
import pg from "pg"
import { loops, since, size, type Ctx } from "../Context.js"
import { measure, meter, type Contender, type Sample, type WorkloadResult } from "../Report.js"
import * as Scanfleet from "../Scanfleet.js"

/** The phases after `assigned` that end a timeline, in order: every one the model allows, then `completed`. */
const tail = [...PhaseModel.scanStage, ...PhaseModel.uploadStage, "completed"] as const

/** How many events one reservation's timeline holds: a stream moves to its next reservation when one is full. */
export const perReservation = PhaseModel.maxSeq

/**
 * The event with sequence `seq` of a timeline: `assigned`, then `recovered`
 * events (legal: they repeat the current phase) up to the last sequence a
 * recovery may take, then every remaining phase, so that a full timeline has
 * PhaseModel.maxSeq events.
 */
export const event = (seq: number, at0: number) =>
  seq === 1
    ? { seq, kind: "phase" as const, phase: "assigned" as PhaseModel.Phase, at: at0 + seq, detail: "bench" }
    : seq <= PhaseModel.lastRecoverySeq
      ? { seq, kind: "recovered" as const, phase: "assigned" as PhaseModel.Phase, at: at0 + seq, detail: "bench" }
      : { seq, kind: "phase" as const, phase: tail[seq - PhaseModel.lastRecoverySeq - 1] as PhaseModel.Phase, at: at0 + seq, detail: "bench" }

if (PhaseModel.lastRecoverySeq + tail.length !== perReservation) throw new Error("the bench's timeline shape no longer fills a timeline")

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
 * The batches one stream sends, each to one of the stream's reservations
 * (`r`, from 0): with 50 % duplicates, each batch after a reservation's first
 * starts with the second half of the previous batch again. A stream moves to
 * its next reservation when a timeline is full.
 */
export const plan = (perStream: number, c: Combo): Array<{ readonly r: number; readonly seqs: Array<number> }> => {
  const out: Array<{ r: number; seqs: Array<number> }> = []
  const fresh = c.dupPercent === 50 ? c.batch / 2 : c.batch
  let r = 0
  let next = 1
  let sent = 0
  while (sent < perStream) {
    if (next > perReservation) {
      r++
      next = 1
    }
    const dup = c.dupPercent === 50 && next > 1 ? Array.from({ length: c.batch / 2 }, (_, i) => next - c.batch / 2 + i).filter((s) => s >= 1) : []
    const n = Math.min(fresh, perReservation - next + 1, Math.max(1, perStream - sent - dup.length))
    const seqs = [...dup, ...Array.from({ length: n }, (_, i) => next + i)]
    next += n
    sent += seqs.length
    out.push({ r, seqs })
  }
  return out
}

/** How many reservations each stream needs for `plan`. */
export const reservationsPerStream = (perStream: number, c: Combo): number => Math.max(...plan(perStream, c).map((b) => b.r)) + 1

interface Driver {
  /** Opens `n` reservations; returns an append function and the timeline reader of each. */
  readonly open: (n: number) => Promise<Array<{ append: (events: ReadonlyArray<Ev>) => Promise<{ accepted: number; duplicate: number }>; seqs: () => Promise<Array<number>> }>>
  readonly close: () => Promise<void>
}

const scanfleetDriver = async (url: string, streams: number): Promise<Driver> => {
  const sf = await Scanfleet.openPg(url, streams + 2)
  let seeded = 0
  const claimOne = (deviceId: number, slot: number, now: number) => sf.run((st) => st.claim({ deviceId, slot, now, config: Scanfleet.config }))
  return {
    open: async (n) => {
      const now = Date.now()
      await sf.run((st) => st.recordObservations(Array.from({ length: n }, (_, i) => ({ source: "github" as const, identity: `p/${seeded}-${i}`, remoteAt: null })), now))
      // Devices of at most 64 slots, each slot holding one reservation.
      const claims: Array<Awaited<ReturnType<typeof claimOne>>> = []
      for (let first = 0; first < n; first += 64) {
        const slots = Math.min(64, n - first)
        const device = await sf.run((st) => st.addDevice({ name: `bench-${seeded}-${first}`, slots, tokenHash: `hash-${seeded}-${first}`, now }))
        for (let slot = 0; slot < slots; slot++) claims.push(await claimOne(device.id, slot, now))
      }
      seeded++
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
      const perStream = Math.ceil(s.events / s.streams)
      const k = reservationsPerStream(perStream, c)
      const reservations = await d.open(s.streams * k)
      await ctx.pg.analyze(db.name)
      const at0 = Date.now()
      let submitted = 0
      let accepted = 0
      let calls = 0
      await ctx.pg.resetStatements()
      const costs = await meter(ctx.pg)
      const t0 = performance.now()
      await loops(s.streams, async (i) => {
        for (const { r: j, seqs } of plan(perStream, c)) {
          const r = await reservations[i * k + j].append(seqs.map((q) => event(q, at0)))
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
      for (const st of reservations) {
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
    title: `Progress ingest: ${s.streams} concurrent streams (a fresh reservation every ${perReservation.toLocaleString("en-US")} events), batches of ${c.batch}, ${c.dupPercent}% duplicates, ${s.events.toLocaleString("en-US")} events submitted per run`,
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
