import { SqliteStore } from "@scanfleet/adapters"
import { Store } from "@scanfleet/core"
import { Effect, Layer, ManagedRuntime } from "effect"
import { type ChildProcess, spawn } from "node:child_process"
import { request } from "node:http"
import { createRequire } from "node:module"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { sqliteFile } from "./fixtures/Databases.js"
import { createServer } from "node:net"
import { prepare, spawnCli } from "./fixtures/ServerProcess.js"

/**
 * A `scanfleet-server` process on one SQLite file while other processes use the
 * same file: a write lock held elsewhere never freezes the server (the wait is
 * asynchronous), a claim never commits after its client's deadline, and a
 * probe on a fresh connection gets `/healthz` within a second throughout; with
 * 200 devices claiming and reporting at once, a probe from another process still
 * answers within a second at p99, and no claim commits after its client gave up.
 */

const require = createRequire(import.meta.url)
const adminToken = "sqlite-load-admin-token-0123456789"

/** GET /healthz on a new connection each time (no keep-alive): the answer's latency in ms. */
const probe = (url: string) =>
  new Promise<number>((resolve, reject) => {
    const u = new URL("/healthz", url)
    const t0 = performance.now()
    const r = request({ host: u.hostname, port: u.port, path: u.pathname, agent: false, headers: { connection: "close" } }, (res) => {
      res.resume()
      res.on("end", () => (res.statusCode === 200 ? resolve(performance.now() - t0) : reject(new Error(`healthz ${res.statusCode}`))))
    })
    r.setTimeout(20_000, () => r.destroy(new Error("healthz timed out")))
    r.on("error", reject)
    r.end()
  })

/**
 * Another process probing `/healthz` on a fresh connection every 100 ms for `ms`: when each
 * probe started (ms from the first) and its latency (ms), or -1 for a probe that failed or
 * took over 20 s.
 */
const probeFromAnotherProcess = (url: string, ms: number) =>
  new Promise<ReadonlyArray<readonly [number, number]>>((resolve, reject) => {
    const code = `const http = require("node:http"); const u = new URL("/healthz", ${JSON.stringify(url)}); const out = []; const start = Date.now(); const end = start + ${ms};
      const one = () => new Promise((r) => { const t0 = performance.now();
        const q = http.request({ host: u.hostname, port: u.port, path: u.pathname, agent: false, headers: { connection: "close" } }, (res) => { res.resume(); res.on("end", () => r(res.statusCode === 200 ? performance.now() - t0 : -1)) });
        q.setTimeout(20000, () => q.destroy()); q.on("error", () => r(-1)); q.end() });
      (async () => { while (Date.now() < end) { const at = Date.now() - start; out.push([at, await one()]); await new Promise((r) => setTimeout(r, 100)) } process.stdout.write(JSON.stringify(out)) })()`
    const child = spawn(process.execPath, ["-e", code], { stdio: ["ignore", "pipe", "inherit"] })
    let text = ""
    child.stdout!.on("data", (d) => (text += d))
    child.on("error", reject)
    child.on("exit", (code) => (code === 0 ? resolve(JSON.parse(text) as Array<[number, number]>) : reject(new Error(`the probe process exited with ${code}`))))
  })

/** Another process that takes the file's write lock and holds it `ms`; resolves once it holds it. */
const holdWriteLock = (file: string, ms: number) =>
  new Promise<{ readonly child: ChildProcess; readonly released: Promise<void> }>((resolve, reject) => {
    const code = `const S = require(${JSON.stringify(require.resolve("better-sqlite3"))}); const db = new S(${JSON.stringify(file)}, { timeout: 10000 });
      db.exec("BEGIN IMMEDIATE"); process.stdout.write("held\\n"); setTimeout(() => { db.exec("ROLLBACK"); db.close(); process.exit(0) }, ${ms})`
    const child = spawn(process.execPath, ["-e", code], { stdio: ["ignore", "pipe", "inherit"] })
    const released = new Promise<void>((r) => child.on("exit", () => r()))
    child.on("error", reject)
    child.stdout!.once("data", () => resolve({ child, released }))
  })

const api = async (url: string, token: string, method: string, path: string, body?: unknown, timeoutMs = 30_000) => {
  const res = await fetch(url + path, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs)
  })
  return { status: res.status, headers: res.headers, body: (await res.json()) as any }
}

describe("a SQLite server shared with other processes", { timeout: 240_000 }, () => {
  const db = sqliteFile()
  const file = db.url.replace(/^sqlite:/, "")
  let server: { readonly url: string; readonly child: ChildProcess }
  let rt: ManagedRuntime.ManagedRuntime<Store.Store, unknown>
  const run = <A, E>(e: Effect.Effect<A, E, Store.Store>) => rt.runPromise(e)

  beforeAll(async () => {
    await prepare()
    // This process opens the file too, as a second writer and to seed it.
    rt = ManagedRuntime.make(Layer.orDie(SqliteStore.layer({ filename: file })))
    await run(Effect.flatMap(Store.Store, (s) => s.recordObservations(Array.from({ length: 6000 }, (_, i) => ({ source: "github" as const, identity: `load/${i}`, remoteAt: null })), Date.now())))
    // Warnings only, on a port chosen here: an access log line per request into a pipe this busy
    // process reads slowly would stall the server (writes to a pipe are synchronous on Linux).
    const port = await new Promise<number>((resolve) => {
      const srv = createServer().listen(0, "127.0.0.1", () => {
        const a = srv.address()
        srv.close(() => resolve(typeof a === "object" && a ? a.port : 0))
      })
    })
    const child = spawnCli(["serve", "--port", String(port)], { SCANFLEET_DATABASE_URL: db.url, SCANFLEET_ADMIN_TOKEN: adminToken, SCANFLEET_LOG_LEVEL: "warning" })
    child.stdout!.resume()
    child.stderr!.resume()
    server = { url: `http://127.0.0.1:${port}`, child }
    for (let i = 0; ; i++) {
      if (child.exitCode !== null) throw new Error(`the server exited with ${child.exitCode}`)
      if (await probe(server.url).then(() => true, () => false)) break
      if (i > 600) throw new Error("the server did not answer /healthz within 60 s")
      await new Promise((r) => setTimeout(r, 100))
    }
  })
  afterAll(async () => {
    if (server && server.child.exitCode === null) {
      const exited = new Promise((r) => server.child.once("exit", r))
      server.child.kill("SIGKILL")
      await exited
    }
    await rt?.dispose()
    db.cleanup()
  })

  const addDevice = async (name: string, slots: number) => {
    const r = await api(server.url, adminToken, "POST", "/v1/admin/devices", { name, slots })
    expect(r.status).toBe(201)
    return r.body.token as string
  }

  it("another process holds the write lock for 10 s: /healthz on fresh connections answers within 1 s throughout; a claim waiting past its client's deadline is refused and never commits; one with no deadline gets 503 store_busy with Retry-After", async () => {
    const token = await addDevice("locked-out", 3)
    const lock = await holdWriteLock(file, 10_000)
    const heldAt = Date.now()
    const latencies: Array<number> = []
    const probing = (async () => {
      while (Date.now() - heldAt < 10_500) {
        latencies.push(await probe(server.url))
        await new Promise((r) => setTimeout(r, 100))
      }
    })()
    const withDeadline = api(server.url, token, "POST", "/v1/assignments/claim", { slot: 0, waitMs: 1500 })
    const noDeadline = api(server.url, token, "POST", "/v1/assignments/claim", { slot: 1 })
    const gaveUp = await withDeadline
    const gaveUpAfter = Date.now() - heldAt
    expect(gaveUp.status, JSON.stringify(gaveUp.body)).toBe(409)
    expect(gaveUp.body.error).toBe("claim_rejected:deadline_passed")
    expect(gaveUpAfter).toBeLessThan(5000)
    const busy = await noDeadline
    expect(busy.status, JSON.stringify(busy.body)).toBe(503)
    expect(busy.body.error).toBe("store_busy")
    expect(Number(busy.headers.get("retry-after"))).toBeGreaterThan(0)
    await probing
    await lock.released
    expect(latencies.length).toBeGreaterThan(30)
    expect(Math.max(...latencies), `healthz latencies: ${latencies.map((l) => l.toFixed(0)).join(" ")}`).toBeLessThan(1000)
    // Nothing of the refused claims was committed: the device holds no reservation, and its slots claim now.
    expect(await run(Effect.flatMap(Store.Store, (s) => s.listAssignments({ state: "active", limit: 100 })))).toEqual([])
    const after = await api(server.url, token, "POST", "/v1/assignments/claim", { slot: 0, waitMs: 5000 })
    expect(after.status).toBe(200)
    expect(after.body.assignment.slot).toBe(0)
  })

  it("200 devices claim and report at once: /healthz from another process answers within 1 s at p99, and no claim commits after its client gave up", async () => {
    const tokens: Array<string> = []
    for (let i = 0; i < 200; i++) tokens.push(await addDevice(`load-${i}`, 1))
    // What each client holds: the reservations it was answered with. A client gives up on a claim
    // after its waitMs (plus the time an answer committed just before the deadline needs to arrive).
    const received = new Set<number>()
    let claims = 0
    let gaveUp = 0
    let refused = 0
    const waitMs = 1500
    const loadMs = 15_000
    const until = Date.now() + loadMs
    // Each device claims, scans for 0.3 to 1 s and posts its result, in a loop: 200 devices keep
    // the server at a couple of hundred requests per second.
    const device = async (token: string) => {
      while (Date.now() < until) {
        claims++
        const r = await api(server.url, token, "POST", "/v1/assignments/claim", { slot: 0, waitMs }, waitMs + 1500).catch(() => null)
        if (r === null) {
          gaveUp++
          continue
        }
        if (r.status !== 200 || r.body.assignment === null) {
          // as a worker does: wait a poll interval before it asks again
          refused++
          await new Promise((res) => setTimeout(res, 1000))
          continue
        }
        const a = r.body.assignment
        received.add(a.reservationId)
        // the scan, then its result
        await new Promise((res) => setTimeout(res, 300 + Math.random() * 700))
        await api(server.url, token, "POST", `/v1/assignments/${a.reservationId}/result`, { fence: a.fence, outcome: "clean", finalPhase: null, findings: [] }).catch(() => null)
      }
    }
    const probes = probeFromAnotherProcess(server.url, loadMs)
    // Another process takes the write lock for 3 s in the middle, so that claims wait and some give up.
    const locking = new Promise((r) => setTimeout(r, 5000)).then(() => holdWriteLock(file, 3000)).then((l) => l.released)
    await Promise.all([...tokens.map(device), locking])
    const probed = await probes
    const latencies = probed.map(([, ms]) => ms)
    // the probes over 300 ms, when they started (ms after the load began) and how long they took
    const slow = `${claims} claims, ${refused} refused, ${gaveUp} given up; slow probes (start:ms) ${probed.filter(([, ms]) => ms > 300 || ms < 0).map(([at, ms]) => `${at}:${ms.toFixed(0)}`).join(" ")}`
    expect(latencies.length, slow).toBeGreaterThan(50)
    expect(latencies.filter((l) => l < 0), slow).toEqual([])
    const sorted = [...latencies].sort((a, b) => a - b)
    const p99 = sorted[Math.min(sorted.length - 1, Math.ceil(0.99 * sorted.length) - 1)]
    console.info(`healthz over ${sorted.length} probes: p50 ${sorted[Math.floor(sorted.length / 2)].toFixed(0)} ms, p99 ${p99.toFixed(0)} ms, max ${sorted[sorted.length - 1].toFixed(0)} ms; ${slow}`)
    expect(p99, `healthz p99 over ${sorted.length} probes; ${slow}`).toBeLessThan(1000)
    expect(received.size, `${claims} claims, ${refused} refused, ${gaveUp} given up`).toBeGreaterThan(400)
    // Every reservation the load devices hold or held was answered to its client: none committed after its client gave up.
    const S = require("better-sqlite3") as typeof import("better-sqlite3")
    const check = new S(file, { readonly: true })
    try {
      const rows = check
        .prepare("SELECT a.reservation_id AS id FROM assignments a JOIN devices d ON d.id = a.device_id WHERE d.name LIKE 'load-%'")
        .all() as Array<{ id: number }>
      expect(rows.map((r) => Number(r.id)).filter((id) => !received.has(id)), `${claims} claims, ${refused} refused, ${gaveUp} given up`).toEqual([])
      expect(rows.length).toBe(received.size)
    } finally {
      check.close()
    }
  })
})
