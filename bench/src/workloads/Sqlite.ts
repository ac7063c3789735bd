/**
 * Workload 7: the claim, discovery and ingest workloads on SQLite, scanfleet's
 * SqliteStore against raw better-sqlite3 prepared statements. Both run on the
 * same schema: the raw file is created by SqliteStore's migrations and then
 * driven directly, so the comparison is the store's overhead, not the schema's.
 */
import Database from "better-sqlite3"
import { Effect } from "effect"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { chunks, since, size, type Ctx } from "../Context.js"
import { measure, type Contender, type Sample, type SystemResult, type WorkloadResult } from "../Report.js"
import * as Scanfleet from "../Scanfleet.js"
import { event, perReservation, plan } from "./Progress.js"

const DAY = 86_400_000

interface Shape {
  readonly backlog: number
  readonly jobs: number
  readonly capSeconds: number
  readonly rows: number
  readonly batch: number
  readonly events: number
  readonly eventBatch: number
}

const identity = (i: number) => `org-${i % 997}/repo-${i}`

// Bytes this process handed to write(2) so far: SQLite's WAL appends and its checkpoints' writes
// to the database file (the store checkpoints on a worker thread of this process; raw
// better-sqlite3 checkpoints inline), so both sides count the same kinds of write.
const written = () => Number(/^wchar: (\d+)$/m.exec(readFileSync("/proc/self/io", "utf8"))?.[1] ?? 0)

/** Starts measuring a section: this process's CPU (the whole store runs in it) and the bytes it wrote; `end` records them per unit under `key`. */
const section = (extra: Record<string, number>, key: string) => {
  const cpu0 = process.cpuUsage()
  const w0 = written()
  return (units: number) => {
    const c = process.cpuUsage(cpu0)
    const per = Math.max(1, units)
    extra[`${key} cpu`] = (c.user + c.system) / per
    extra[`${key} written`] = (written() - w0) / per
  }
}

const freshFile = () => {
  const dir = mkdtempSync(join(tmpdir(), "scanfleet-bench-sqlite-"))
  return { file: join(dir, "bench.db"), remove: () => rmSync(dir, { recursive: true, force: true }) }
}

const scanfleetRun = async (s: Shape): Promise<Sample> => {
  const f = freshFile()
  let sf = await Scanfleet.openSqlite(f.file)
  try {
    const now = Date.now()
    const extra: Record<string, number> = {}
    // claim + complete, one at a time
    const device = await sf.run((st) => st.addDevice({ name: "bench", slots: 1, tokenHash: "h", now }))
    for (const c of chunks(Array.from({ length: s.backlog }, (_, i) => i), 10_000))
      await sf.run((st) => st.recordObservations(c.map((i) => ({ source: "gitlab" as const, identity: `q/${i}`, remoteAt: null })), now))
    const claimOne = async () => {
      const a = await sf.run((st) => st.claim({ deviceId: device.id, slot: 0, now: Date.now(), config: Scanfleet.config }))
      if (a === null) throw new Error("backlog ran dry")
      return a
    }
    const resultOf = (a: { reservationId: number; fence: number; deviceId: number }) =>
      ({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: Date.now(), outcome: "clean", finalPhase: null, body: "{}" }) as const
    // the one-call loop: a claim, then each result with the slot's next claim, then the last result on its own
    let done = 1
    let cost = section(extra, "claim+complete jobs/s")
    let t0 = performance.now()
    let deadline = t0 + s.capSeconds * 1000
    let a = await claimOne()
    while (done < s.jobs && performance.now() < deadline) {
      const r = await sf.run((st) => st.submitResultAndClaim(resultOf(a), { slot: 0, config: Scanfleet.config }))
      if (r.next === null) throw new Error("backlog ran dry")
      a = r.next
      done++
    }
    await sf.run((st) => st.submitResult(resultOf(a)))
    extra["claim+complete jobs/s"] = done / since(t0)
    cost(done)
    // the two-call loop, on the rest of the backlog
    done = 0
    cost = section(extra, "claim+complete jobs/s, apart")
    t0 = performance.now()
    deadline = t0 + s.capSeconds * 1000
    while (done < s.jobs && performance.now() < deadline) {
      const a = await claimOne()
      await sf.run((st) => st.submitResult(resultOf(a)))
      done++
    }
    extra["claim+complete jobs/s, apart"] = done / since(t0)
    cost(done)
    // discovery: seed, mark completed, then a 10 %-newer pass
    const ids = Array.from({ length: s.rows }, (_, i) => i)
    for (const c of chunks(ids, s.batch))
      await sf.run((st) => st.recordObservations(c.map((i) => ({ source: "github" as const, identity: identity(i), remoteAt: now - 10 * DAY + i })), now))
    // This file's own better-sqlite3 is another copy of SQLite than the store's: two copies must
    // never have one file open at once (each takes the other's locks for its own, and one truncated
    // the shared-memory index the other's checkpoint thread was reading: a SIGBUS). So the store
    // is closed around this connection.
    await sf.close()
    const db = new Database(f.file)
    db.prepare("UPDATE targets SET status = 'completed', covered_remote_at = observed_remote_at, completed_at = ?, last_scan_started_at = ? WHERE source = 'github'").run(now - 5 * DAY, now - 5 * DAY)
    db.close()
    sf = await Scanfleet.openSqlite(f.file)
    cost = section(extra, "discovery obs/s (10% newer)")
    t0 = performance.now()
    for (const c of chunks(ids, s.batch))
      await sf.run((st) =>
        st.recordObservations(c.map((i) => ({ source: "github" as const, identity: identity(i), remoteAt: i % 10 === 0 ? now - DAY : now - 10 * DAY + i })), now)
      )
    extra["discovery obs/s (10% newer)"] = s.rows / since(t0)
    cost(s.rows)
    // progress ingest, batches of eventBatch, a fresh reservation whenever a timeline is full
    const batches = plan(s.events, { batch: s.eventBatch, dupPercent: 0 })
    const k = batches.at(-1)!.r + 1
    const as = await sf.run((st) =>
      Effect.gen(function* () {
        yield* st.recordObservations(Array.from({ length: k }, (_, i) => ({ source: "huggingface" as const, identity: `progress-${i}`, remoteAt: null })), now)
        const d = yield* st.addDevice({ name: "p", slots: k, tokenHash: "p", now })
        return yield* Effect.forEach(Array.from({ length: k }, (_, slot) => slot), (slot) =>
          Effect.flatMap(st.claim({ deviceId: d.id, slot, now, config: Scanfleet.config, sources: ["huggingface"] }), Effect.fromNullable)
        )
      })
    )
    cost = section(extra, "ingest events/s")
    t0 = performance.now()
    for (const { r, seqs } of batches) {
      const a = as[r]
      await sf.run((st) => st.appendProgress({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: Date.now() }, seqs.map((q) => event(q, now))))
    }
    extra["ingest events/s"] = s.events / since(t0)
    cost(s.events)
    let stored = 0
    for (const a of as) stored += (await sf.run((st) => st.timeline(a.reservationId))).length
    if (stored !== s.events) throw new Error(`verification: ${stored} events stored, expected ${s.events}`)
    return { value: extra["claim+complete jobs/s"], extra }
  } finally {
    await sf.close()
    f.remove()
  }
}

const rawRun = async (s: Shape): Promise<Sample> => {
  const f = freshFile()
  // the same schema as scanfleet's: its own migrations create it
  await (await Scanfleet.openSqlite(f.file)).close()
  const db = new Database(f.file)
  db.pragma("journal_mode = WAL")
  // As SqliteStore opens its file: no fsync per commit in WAL mode.
  db.pragma("synchronous = NORMAL")
  try {
    const now = Date.now()
    const extra: Record<string, number> = {}
    const deviceId = Number(db.prepare("INSERT INTO devices (name, slots, token_hash, created_at) VALUES ('bench', 1, 'h', ?)").run(now).lastInsertRowid)
    const upsert = db.prepare(`
      INSERT INTO targets (source, identity, status, observed_remote_at, discovered_at) VALUES (?, ?, 'pending', ?, ?)
      ON CONFLICT (source, identity) DO UPDATE
        SET observed_remote_at = MAX(COALESCE(targets.observed_remote_at, excluded.observed_remote_at), excluded.observed_remote_at)
        WHERE excluded.observed_remote_at IS NOT NULL
          AND (targets.observed_remote_at IS NULL OR excluded.observed_remote_at > targets.observed_remote_at)`)
    const record = db.transaction((rows: ReadonlyArray<readonly [string, string, number | null]>) => {
      for (const r of rows) upsert.run(r[0], r[1], r[2], now)
    })
    for (const c of chunks(Array.from({ length: s.backlog }, (_, i) => i), 10_000)) record.immediate(c.map((i) => ["gitlab", `q/${i}`, null] as const))
    // claim: the same single-statement pick as the store, in the order of the schema's claim index
    // (targets_claim_idx, partial on pending: an ORDER BY id alone would walk every completed row
    // at the head of the table), plus the reservation row
    const pick = db.prepare(`
      UPDATE targets SET status = 'in_progress', covered_remote_at = observed_remote_at, fence = fence + 1, last_scan_started_at = ?, attempts = attempts + 1
      WHERE status = 'pending' AND id = (SELECT id FROM targets WHERE status = 'pending' ORDER BY id - priority * 10000, id LIMIT 1)
      RETURNING id, source, identity, fence, covered_remote_at`)
    // The reservation references a policy row, as the store's do since migration 0012.
    const policyId = Number(
      db.prepare("INSERT INTO policies (source, policy, scan_ms, upload_ms, expiry_ms) VALUES ('gitlab', '{}', 1800000, 2100000, 3600000)").run().lastInsertRowid
    )
    const reserve = db.prepare(`
      INSERT INTO assignments (target_id, source, identity, device_id, device_slots, slot, fence, policy_id, covered_remote_at, issued_at, scan_deadline, upload_deadline, expires_at, state)
      VALUES (?, ?, ?, ?, 1, 0, ?, ${policyId}, ?, ?, ?, ?, ?, 'active') RETURNING reservation_id`)
    const claim = db.transaction((t: number) => {
      const row = pick.get(t) as { id: number; source: string; identity: string; fence: number; covered_remote_at: number | null } | undefined
      if (!row) return null
      const r = reserve.get(row.id, row.source, row.identity, deviceId, row.fence, row.covered_remote_at, t, t + 1800_000, t + 2100_000, t + 3600_000) as { reservation_id: number }
      return { targetId: row.id, fence: row.fence, reservationId: r.reservation_id }
    })
    // The result on its reservation row, as the store keeps it since migration 0006.
    const endA = db.prepare("UPDATE assignments SET state = 'completed', outcome = 'clean', ended_at = ?, result_body = '{}' WHERE reservation_id = ? AND fence = ? AND state = 'active'")
    const endT = db.prepare("UPDATE targets SET status = 'completed', completed_at = ? WHERE id = ? AND status = 'in_progress' AND fence = ?")
    const complete = db.transaction((c: { targetId: number; fence: number; reservationId: number }, t: number) => {
      if (endA.run(t, c.reservationId, c.fence).changes !== 1 || endT.run(t, c.targetId, c.fence).changes !== 1) throw new Error("fenced complete refused")
    })
    let done = 0
    let cost = section(extra, "claim+complete jobs/s")
    let t0 = performance.now()
    const deadline = t0 + s.capSeconds * 1000
    while (done < s.jobs && performance.now() < deadline) {
      const c = claim.immediate(Date.now())
      if (c === null) throw new Error("backlog ran dry")
      complete.immediate(c, Date.now())
      done++
    }
    extra["claim+complete jobs/s"] = done / since(t0)
    cost(done)
    const ids = Array.from({ length: s.rows }, (_, i) => i)
    for (const c of chunks(ids, s.batch)) record.immediate(c.map((i) => ["github", identity(i), now - 10 * DAY + i] as const))
    db.prepare("UPDATE targets SET status = 'completed', covered_remote_at = observed_remote_at, completed_at = ?, last_scan_started_at = ? WHERE source = 'github'").run(now - 5 * DAY, now - 5 * DAY)
    cost = section(extra, "discovery obs/s (10% newer)")
    t0 = performance.now()
    for (const c of chunks(ids, s.batch)) record.immediate(c.map((i) => ["github", identity(i), i % 10 === 0 ? now - DAY : now - 10 * DAY + i] as const))
    extra["discovery obs/s (10% newer)"] = s.rows / since(t0)
    cost(s.rows)
    const batches = plan(s.events, { batch: s.eventBatch, dupPercent: 0 })
    // One reservation per slot of a device of its own, as the store's side claims them.
    const k = batches.at(-1)!.r + 1
    const ingestDevice = Number(db.prepare("INSERT INTO devices (name, slots, token_hash, created_at) VALUES ('p', ?, 'p', ?)").run(k, now).lastInsertRowid)
    const reserveSlot = db.prepare(`
      INSERT INTO assignments (target_id, source, identity, device_id, device_slots, slot, fence, policy_id, covered_remote_at, issued_at, scan_deadline, upload_deadline, expires_at, state)
      VALUES (?, ?, ?, ?, ?, ?, ?, ${policyId}, ?, ?, ?, ?, ?, 'active') RETURNING reservation_id`)
    const claimSlot = db.transaction((slot: number, t: number) => {
      const row = pick.get(t) as { id: number; source: string; identity: string; fence: number; covered_remote_at: number | null }
      const r = reserveSlot.get(row.id, row.source, row.identity, ingestDevice, k, slot, row.fence, row.covered_remote_at, t, t + 1800_000, t + 2100_000, t + 3600_000) as {
        reservation_id: number
      }
      return { fence: row.fence, reservationId: r.reservation_id }
    })
    const ps = Array.from({ length: k }, (_, slot) => claimSlot.immediate(slot, now))
    const ins = db.prepare("INSERT INTO progress_events (reservation_id, seq, kind, phase, at, detail, accepted_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING")
    const bump = db.prepare("UPDATE assignments SET last_seq = ?, last_phase = ?, last_progress_at = ? WHERE reservation_id = ? AND fence = ? AND state = 'active'")
    const append = db.transaction((p: (typeof ps)[number], evs: ReadonlyArray<ReturnType<typeof event>>, t: number) => {
      for (const e of evs) ins.run(p.reservationId, e.seq, e.kind, e.phase, e.at, e.detail, t)
      const last = evs[evs.length - 1]
      bump.run(last.seq, last.phase, t, p.reservationId, p.fence)
    })
    cost = section(extra, "ingest events/s")
    t0 = performance.now()
    for (const { r, seqs } of batches)
      append.immediate(
        ps[r],
        seqs.map((q) => event(q, now)),
        Date.now()
      )
    extra["ingest events/s"] = s.events / since(t0)
    cost(s.events)
    return { value: extra["claim+complete jobs/s"], extra }
  } finally {
    db.close()
    f.remove()
  }
}

// One section's figures as a table's samples: its rate, its CPU per unit (no server: SQLite runs in
// the process) and its bytes written per unit in the WAL column.
const pick = (systems: ReadonlyArray<SystemResult>, key: string): Array<SystemResult> =>
  systems.map((s) => ({
    ...s,
    samples: s.samples.map((x) => ({
      value: Number(x.extra?.[key]),
      cpu: { clientMicros: Number(x.extra?.[`${key} cpu`]), serverMicros: 0 },
      walPerUnit: Number(x.extra?.[`${key} written`])
    }))
  }))

/** Workload 7 as three tables. */
export const all = async (ctx: Ctx): Promise<Array<WorkloadResult>> => {
  const s: Shape = {
    backlog: size(ctx, "sqlite.backlog", 5_000, 20_000),
    jobs: size(ctx, "sqlite.jobs", 1_000, 5_000),
    capSeconds: size(ctx, "sqlite.cap", 3, 10),
    rows: size(ctx, "sqlite.rows", 20_000, 100_000),
    batch: 10_000,
    events: size(ctx, "sqlite.events", 5_000, 20_000),
    eventBatch: 100
  }
  const missing = await Scanfleet.sqliteMissing()
  if (missing) throw new Error(`scanfleet's SqliteStore is needed (the raw side uses its schema): ${missing}`)
  const contenders: Array<Contender> = [
    {
      name: "scanfleet SqliteStore",
      note: "the Store port through Effect, one file in WAL mode; the claim loop is a Store.claim, then Store.submitResultAndClaim (the result and the slot's next claim in one transaction) until the last result",
      run: () => scanfleetRun(s)
    },
    { name: "raw better-sqlite3", note: "prepared statements in IMMEDIATE transactions, same schema and the same SQL shapes, no phase-model or ownership checks beyond the fence", run: () => rawRun(s) }
  ]
  const systems = await measure(contenders, ctx.runs, ctx.log)
  const common = "SQLite in WAL mode with synchronous = NORMAL (SqliteStore's default), one process, one connection, sequential"
  const costs = "CPU is the whole process's (SQLite runs in it: the server column is 0); the WAL column is every byte the process wrote (WAL frames and checkpoints into the database file)"
  return [
    {
      id: "7.claim",
      title: `SQLite: claim + fenced complete, one at a time (${s.backlog.toLocaleString("en-US")} backlog, up to ${s.jobs.toLocaleString("en-US")} jobs or ${s.capSeconds} s)`,
      goal: ">= 0.7x raw better-sqlite3",
      unit: "jobs/s",
      higherIsBetter: true,
      systems: [
        ...pick(systems, "claim+complete jobs/s").slice(0, 1),
        ...pick(systems.slice(0, 1), "claim+complete jobs/s, apart").map((x) => ({ ...x, system: `${x.system} (claim and result apart)`, note: "the same store and run, the next jobs of its backlog: a loop of Store.claim then Store.submitResult" })),
        ...pick(systems, "claim+complete jobs/s").slice(1)
      ],
      notes: [common, costs]
    },
    {
      id: "7.discovery",
      title: `SQLite: record ${s.rows.toLocaleString("en-US")} observations, 10% newer, batches of ${s.batch.toLocaleString("en-US")}`,
      goal: ">= 0.7x raw better-sqlite3",
      unit: "obs/s",
      higherIsBetter: true,
      systems: pick(systems, "discovery obs/s (10% newer)"),
      notes: [costs]
    },
    {
      id: "7.ingest",
      title: `SQLite: progress ingest, ${s.events.toLocaleString("en-US")} events in batches of ${s.eventBatch}, a fresh reservation every ${perReservation.toLocaleString("en-US")}, no duplicates`,
      goal: ">= 0.7x raw better-sqlite3",
      unit: "events/s",
      higherIsBetter: true,
      systems: pick(systems, "ingest events/s"),
      notes: [costs]
    }
  ]
}
