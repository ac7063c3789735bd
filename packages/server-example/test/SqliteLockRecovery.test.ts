import Sqlite from "better-sqlite3"
import { type ChildProcess, spawn } from "node:child_process"
import { createHash } from "node:crypto"
import { createRequire } from "node:module"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { sqliteFile } from "./fixtures/Databases.js"
import { prepare, serve, type ServerProcess } from "./fixtures/ServerProcess.js"

/**
 * A `scanfleet-server` on a SQLite file under load while another process holds the
 * file's write lock for longer than the busy timeout (5 s): every write that waits for
 * the lock is answered within its budget, results with findings (the `SqlClient`
 * transaction path) included, and once the lock is released everything recovers by
 * itself: the expiry sweeper runs again, `/readyz` is 200, shutdown is prompt.
 *
 * Before the fix, a transaction's wait for its turn at the lock ran uninterruptibly
 * (`@effect/sql` acquires a transaction's connection so), where its timeout could only
 * wait for the wait to end: it waited past its deadline, got the turn and dropped it as
 * timed out. With the only turn lost, every later transaction that met the lock (the
 * sweeper's, results with findings) waited for ever: results had no answer after 30 s,
 * the silent reservation stayed active, `/readyz` stayed 503 and SIGTERM did not end the
 * process within 20 s. And each of the store's runs of a refused transaction again waited
 * a budget of its own (5 runs, 25 s for a 503).
 */

const require = createRequire(import.meta.url)
const adminToken = "sqlite-lock-recovery-admin-token-0123"
const lockMs = 20_000

/** Another process that takes the file's write lock and holds it `ms`; resolves once it holds it. */
const holdWriteLock = (file: string, ms: number) =>
  new Promise<{ readonly child: ChildProcess; readonly released: Promise<number> }>((resolve, reject) => {
    const code = `const S = require(${JSON.stringify(require.resolve("better-sqlite3"))}); const db = new S(${JSON.stringify(file)}, { timeout: 10000 });
      db.exec("BEGIN IMMEDIATE"); process.stdout.write("held\\n"); setTimeout(() => { db.exec("ROLLBACK"); db.close(); process.exit(0) }, ${ms})`
    const child = spawn(process.execPath, ["-e", code], { stdio: ["ignore", "pipe", "inherit"] })
    const released = new Promise<number>((r) => child.on("exit", () => r(Date.now())))
    child.on("error", reject)
    child.stdout!.once("data", () => resolve({ child, released }))
  })

/** One HTTP request and how long its answer took; status 0 when it got none within 30 s. */
interface Answer {
  readonly label: string
  readonly status: number
  readonly error: string | undefined
  readonly retryAfter: string | null
  readonly ms: number
  readonly at: number
  readonly body: any
}

const call = async (url: string, token: string, label: string, method: string, path: string, body?: unknown, extra: Record<string, string> = {}): Promise<Answer> => {
  const at = Date.now()
  try {
    const res = await fetch(url + path, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }), ...extra },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(30_000)
    })
    const text = await res.text()
    let json: any = null
    try {
      json = JSON.parse(text)
    } catch {
      // not JSON: kept as null
    }
    return { label, status: res.status, error: json?.error, retryAfter: res.headers.get("retry-after"), ms: Date.now() - at, at, body: json }
  } catch {
    return { label, status: 0, error: "no answer", retryAfter: null, ms: Date.now() - at, at, body: null }
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

describe("a SQLite server under load while another process holds the write lock past the busy timeout", { timeout: 180_000 }, () => {
  const db = sqliteFile()
  const file = db.url.replace(/^sqlite:/, "")
  let server: ServerProcess

  beforeAll(async () => {
    await prepare()
    server = await serve([], { SCANFLEET_DATABASE_URL: db.url, SCANFLEET_ADMIN_TOKEN: adminToken, SCANFLEET_LOG_LEVEL: "info", SCANFLEET_SWEEP_INTERVAL_MS: "1000" })
  })
  afterAll(async () => {
    if (server && server.child.exitCode === null && server.child.signalCode === null) await server.stop("SIGKILL")
    db.cleanup()
  })

  it("every waiting write is answered within its budget (results 503 store_busy), and after the lock the sweeper expires a reservation past its expiry, /readyz is 200 and shutdown is prompt", async () => {
    const admin = (label: string, method: string, path: string, body?: unknown) => call(server.url, adminToken, label, method, path, body, { "x-scanfleet-actor": "test" })
    // Short assignments, so a reservation claimed before the lock expires just after it.
    const policy = { scanTimeoutSeconds: 8, uploadTimeoutSeconds: 4, cooldownSeconds: 60, promotionBudget: 100, updatedRescans: true }
    const config = {
      version: 1,
      assignments: { globalTtlSeconds: 14, handoffMarginSeconds: 2, overrides: {} },
      sources: { github: policy, gitlab: policy, huggingface: policy, dockerhub: { ...policy, promotionBudget: 0, updatedRescans: false } },
      expiry: { maxAttempts: 3 },
      metrics: { minSamples: 20 }
    }
    const applied = await admin("config", "POST", "/v1/admin/config/apply", config)
    expect(applied.status, JSON.stringify(applied.body)).toBe(201)
    const added = await admin("targets", "POST", "/v1/admin/targets", { targets: Array.from({ length: 400 }, (_, i) => ({ source: "github", identity: `lock/t-${i}` })), reason: "test" })
    expect(added.status, JSON.stringify(added.body)).toBe(201)
    const device = async (name: string, slots: number) => {
      const r = await admin("device", "POST", "/v1/admin/devices", { name, slots })
      expect(r.status, JSON.stringify(r.body)).toBe(201)
      return r.body.token as string
    }

    // A device that claims once and goes silent: the sweeper must expire its reservation.
    const idle = await device("idle", 1)
    const claimed = await call(server.url, idle, "claim", "POST", "/v1/assignments/claim", { slot: 0 })
    expect(claimed.status, JSON.stringify(claimed.body)).toBe(200)
    const silent = claimed.body.assignment as { reservationId: number }

    // Three devices, two slots each: claim, two progress batches, a result with two findings, in a loop.
    const answers: Array<Answer> = []
    let stop = false
    const slot = async (token: string, slot: number) => {
      // Until a 2xx or a refusal other than 503; a 503 is retried after its Retry-After, as a worker does.
      const send = async (label: string, path: string, body: unknown) => {
        for (;;) {
          const a = await call(server.url, token, label, "POST", path, body)
          answers.push(a)
          if (a.status !== 503 || stop) return a
          await sleep(Math.min(2, Number(a.retryAfter ?? 1)) * 1000)
        }
      }
      while (!stop) {
        const c = await send("claim", "/v1/assignments/claim", { slot })
        const a = c.body?.assignment
        if (c.status !== 200 || !a) {
          await sleep(500)
          continue
        }
        const id = a.reservationId as number
        let seq = 0
        for (const phases of [["assigned", "preparing", "acquiring", "scanning"], ["filtering", "cleanup", "staging", "bundling", "uploading"]]) {
          await send("progress", `/v1/assignments/${id}/progress`, { fence: a.fence, events: phases.map((phase) => ({ seq: ++seq, kind: "phase", phase, at: Date.now() })) })
          await sleep(100 + Math.random() * 300)
        }
        const fp = (k: number) => "hmac-sha256:" + createHash("sha256").update(`${id}-${k}`).digest("hex")
        const findings = [0, 1].map((k) => ({ scanner: "gitleaks", detector: "aws-access-token", path: `f${k}.env`, line: k + 1, fingerprint: fp(k), preview: "AKIA…(20)", secretFields: ["Secret"] }))
        await send("result", `/v1/assignments/${id}/result`, { fence: a.fence, outcome: "findings", finalPhase: "uploading", findings, log: "2 findings" })
      }
    }
    const tokens = [await device("load-0", 2), await device("load-1", 2), await device("load-2", 2)]
    const load = Promise.all(tokens.flatMap((t) => [slot(t, 0), slot(t, 1)]))

    await sleep(2000)
    const lock = await holdWriteLock(file, lockMs)
    const heldAt = Date.now()
    const releasedAt = await lock.released

    // After the lock: the silent reservation, past its expiry, is expired by the sweeper within a few sweeps.
    const reader = new Sqlite(file, { readonly: true, timeout: 5000 })
    const stateOf = () => (reader.prepare("SELECT state FROM assignments WHERE reservation_id = ?").pluck().get(silent.reservationId) as string)
    const silentExpiry = Number(reader.prepare("SELECT expires_at FROM assignments WHERE reservation_id = ?").pluck().get(silent.reservationId))
    const expiredBy = Math.max(releasedAt, silentExpiry) + 6000
    while (stateOf() === "active" && Date.now() < expiredBy) await sleep(200)
    const silentState = stateOf()
    reader.close()
    const ready = await call(server.url, adminToken, "readyz", "GET", "/readyz")
    // The devices get back to work: a claim after the release and its result accepted.
    const resultAfter = () => answers.some((a) => a.label === "result" && a.status === 200 && a.at > releasedAt)
    while (!resultAfter() && Date.now() < releasedAt + 20_000) await sleep(200)
    stop = true
    await Promise.race([load, sleep(35_000)])

    const stoppedAt = Date.now()
    const stopped = await Promise.race([server.stop("SIGTERM").then(() => true), sleep(20_000).then(() => false)])
    const shutdownMs = Date.now() - stoppedAt

    const summary = (as: ReadonlyArray<Answer>) =>
      as.map((a) => `${a.label}@${a.at - heldAt}:${a.status}${a.error ? `/${a.error}` : ""}:${a.ms}ms`).join(" ")
    // Every request was answered within its budget: the 5 s busy timeout and a margin for a busy machine.
    const slow = answers.filter((a) => a.status === 0 || a.ms > 10_000)
    expect(summary(slow), `silent reservation ${silentState}, /readyz ${ready.status}, shutdown ${stopped ? `${shutdownMs} ms` : "not within 20 s"}`).toBe("")
    // During the lock, results (the transaction path) were refused 503 store_busy with Retry-After, not held.
    const duringLock = answers.filter((a) => a.at >= heldAt && a.at + a.ms <= releasedAt)
    const busyResults = duringLock.filter((a) => a.label === "result" && a.status === 503)
    expect(busyResults.length, summary(duringLock)).toBeGreaterThan(0)
    for (const a of busyResults) {
      expect(a.error).toBe("store_busy")
      expect(Number(a.retryAfter)).toBeGreaterThan(0)
    }
    // Work went on after the lock: results were accepted again.
    expect(resultAfter(), summary(answers.filter((a) => a.at > releasedAt))).toBe(true)
    expect(silentState, `the silent reservation after the lock (expiry ${silentExpiry - releasedAt} ms after the release)\n${server.output().slice(-3000)}`).toBe("expired")
    expect(ready.status, JSON.stringify(ready.body)).toBe(200)
    expect(stopped, server.output().slice(-2000)).toBe(true)
    expect(shutdownMs, server.output().slice(-2000)).toBeLessThan(10_000)
  })
})
