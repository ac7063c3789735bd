/**
 * Measures the two ways a SQLite Store can wait for a write lock without blocking
 * the event loop: (a) prepared statements on the event-loop thread with
 * `busy_timeout = 0` and an asynchronous retry, (b) the database on a worker
 * thread (its own busy timeout blocks only that thread), each job a message round
 * trip; and, for comparison, SQLite's own busy handler on the event-loop thread. For each: sequential claim + complete jobs per second with the lock free,
 * the CPU time of this process per job, and the event loop's delay (p50/p99/max)
 * while another process holds the write lock for 2 s and a job waits for it.
 *
 *   npx tsx packages/adapters/scripts/sqlite-lock-wait.ts
 */
import Sqlite from "better-sqlite3"
import { spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Worker } from "node:worker_threads"
import { createRequire } from "node:module"

const require = createRequire(import.meta.url)

const JOBS = Number(process.env.JOBS ?? 5000)
const dir = mkdtempSync(join(tmpdir(), "scanfleet-lockwait-"))
const file = join(dir, "w.db")

const schema = `
  PRAGMA journal_mode = WAL;
  CREATE TABLE IF NOT EXISTS targets (id INTEGER PRIMARY KEY, status TEXT NOT NULL, fence INTEGER NOT NULL DEFAULT 0, completed_at INTEGER);
  CREATE INDEX IF NOT EXISTS targets_pending ON targets (id) WHERE status = 'pending';
  CREATE TABLE IF NOT EXISTS assignments (reservation_id INTEGER PRIMARY KEY, target_id INTEGER NOT NULL, fence INTEGER NOT NULL, state TEXT NOT NULL, ended_at INTEGER, body TEXT);`

// The job both ways run: a claim transaction and a fenced complete transaction.
const jobSource = `
  const prepare = (db) => {
    const pick = db.prepare("UPDATE targets SET status = 'in_progress', fence = fence + 1 WHERE status = 'pending' AND id = (SELECT id FROM targets WHERE status = 'pending' ORDER BY id LIMIT 1) RETURNING id, fence")
    const reserve = db.prepare("INSERT INTO assignments (target_id, fence, state) VALUES (?, ?, 'active')")
    const endT = db.prepare("UPDATE targets SET status = 'completed', completed_at = ? WHERE id = ? AND status = 'in_progress' AND fence = ?")
    const endA = db.prepare("UPDATE assignments SET state = 'completed', ended_at = ?, body = '{}' WHERE reservation_id = ? AND state = 'active'")
    const claim = db.transaction(() => { const t = pick.get(); return { t, r: Number(reserve.run(t.id, t.fence).lastInsertRowid) } })
    const complete = db.transaction((c) => { endT.run(Date.now(), c.t.id, c.t.fence); endA.run(Date.now(), c.r) })
    return () => complete.immediate(claim.immediate())
  }`
// eslint-disable-next-line no-new-func
const prepareJob = new Function(`${jobSource}; return prepare`)() as (db: Sqlite.Database) => () => void

const seed = () => {
  rmSync(file, { force: true })
  rmSync(`${file}-wal`, { force: true })
  rmSync(`${file}-shm`, { force: true })
  const db = new Sqlite(file)
  db.exec(schema)
  const ins = db.prepare("INSERT INTO targets (status) VALUES ('pending')")
  db.transaction(() => {
    for (let i = 0; i < JOBS + 10; i++) ins.run()
  })()
  db.close()
}

/** Another process that takes the write lock and holds it for `ms`; resolves once it holds it. */
const holdLock = (ms: number) =>
  new Promise<{ readonly done: Promise<void> }>((resolve) => {
    const code = `const S = require(${JSON.stringify(require.resolve("better-sqlite3"))}); const db = new S(${JSON.stringify(file)}); db.exec("BEGIN IMMEDIATE"); process.stdout.write("held\\n"); setTimeout(() => { db.exec("ROLLBACK"); db.close(); process.exit(0) }, ${ms})`
    const child = spawn(process.execPath, ["-e", code], { stdio: ["ignore", "pipe", "inherit"] })
    const done = new Promise<void>((r) => child.on("exit", () => r()))
    child.stdout.once("data", () => resolve({ done }))
  })

const cpuMs = () => {
  const u = process.cpuUsage()
  return (u.user + u.system) / 1000
}

interface Mode {
  readonly name: string
  readonly open: () => Promise<{ readonly job: () => Promise<void>; readonly close: () => Promise<void> }>
}

const inThread: Mode = {
  name: "event-loop thread, busy_timeout 0, async retry",
  open: async () => {
    const db = new Sqlite(file, { timeout: 0 })
    db.pragma("journal_mode = WAL")
    const run = prepareJob(db)
    const job = async () => {
      for (let wait = 0.5; ; wait = Math.min(wait * 2, 20)) {
        try {
          return run()
        } catch (e) {
          if (!String((e as { code?: string }).code).startsWith("SQLITE_BUSY")) throw e
          await new Promise((r) => setTimeout(r, wait * (0.5 + Math.random())))
        }
      }
    }
    return { job, close: async () => db.close() }
  }
}

const blocking: Mode = {
  name: "event-loop thread, busy_timeout 5000 (SQLite waits)",
  open: async () => {
    const db = new Sqlite(file, { timeout: 5000 })
    db.pragma("journal_mode = WAL")
    const run = prepareJob(db)
    return { job: async () => run(), close: async () => db.close() }
  }
}

const onWorker: Mode = {
  name: "worker thread, busy_timeout 5000, message per job",
  open: async () => {
    const worker = new Worker(
      `const { parentPort } = require("node:worker_threads"); const S = require(${JSON.stringify(require.resolve("better-sqlite3"))});
       ${jobSource}
       const db = new S(${JSON.stringify(file)}, { timeout: 5000 }); db.pragma("journal_mode = WAL"); const run = prepare(db);
       parentPort.on("message", (id) => { try { run(); parentPort.postMessage([id, null]) } catch (e) { parentPort.postMessage([id, String(e)]) } })`,
      { eval: true }
    )
    const waiting = new Map<number, (e: string | null) => void>()
    worker.on("message", ([id, err]: [number, string | null]) => waiting.get(id)?.(err))
    let next = 0
    const job = () =>
      new Promise<void>((resolve, reject) => {
        const id = next++
        waiting.set(id, (err) => {
          waiting.delete(id)
          if (err === null) resolve()
          else reject(new Error(err))
        })
        worker.postMessage(id)
      })
    return { job, close: () => worker.terminate().then(() => undefined) }
  }
}

const measure = async (mode: Mode) => {
  seed()
  const { job, close } = await mode.open()
  for (let i = 0; i < 200; i++) await job()
  const c0 = cpuMs()
  const t0 = performance.now()
  for (let i = 200; i < JOBS; i++) await job()
  const seconds = (performance.now() - t0) / 1000
  const cpuPerJob = ((cpuMs() - c0) * 1000) / (JOBS - 200)
  // A job that must wait 2 s for another process's lock, while the loop's delay is sampled.
  const released = await holdLock(2000)
  // A 5 ms timer: each late firing is how long the loop could not run anything else.
  const gaps: Array<number> = []
  let last = performance.now()
  const timer = setInterval(() => {
    const t = performance.now()
    gaps.push(Math.max(0, t - last - 5))
    last = t
  }, 5)
  const t1 = performance.now()
  await job()
  const waited = performance.now() - t1
  clearInterval(timer)
  gaps.push(Math.max(0, performance.now() - last - 5))
  gaps.sort((a, b) => a - b)
  const q = (p: number) => +gaps[Math.min(gaps.length - 1, Math.floor(p * gaps.length))].toFixed(1)
  await released.done
  await close()
  return {
    mode: mode.name,
    "jobs/s": Math.round((JOBS - 200) / seconds),
    "CPU µs/job (this process)": Math.round(cpuPerJob),
    "job waited for the lock, ms": Math.round(waited),
    "loop delay p50 ms": q(0.5),
    "loop delay p99 ms": q(0.99),
    "loop delay max ms": q(1)
  }
}

const main = async () => {
  const rows = []
  for (const m of [inThread, onWorker, blocking, inThread, onWorker, blocking]) rows.push(await measure(m))
  console.table(rows)
  rmSync(dir, { recursive: true, force: true })
}

void main()
