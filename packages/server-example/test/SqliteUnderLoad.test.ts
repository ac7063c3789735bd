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
 * probe on a fresh connection gets `/healthz` within a second throughout.
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
    await run(Effect.flatMap(Store.Store, (s) => s.recordObservations(Array.from({ length: 2000 }, (_, i) => ({ source: "github" as const, identity: `load/${i}`, remoteAt: null })), Date.now())))
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
})
