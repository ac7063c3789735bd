import pg from "pg"
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest"
import { pgDatabase } from "./fixtures/Databases.js"
import * as PgProxy from "./fixtures/PgProxy.js"
import { prepare, serve, type ServerProcess } from "./fixtures/ServerProcess.js"

const adminToken = "pg-stall-admin-token-0123456789"

describe("a PostgreSQL that stalls or stops answering, under a server process", { timeout: 180_000 }, () => {
  let db: Awaited<ReturnType<typeof pgDatabase>>
  let via: PgProxy.PgProxy
  let server: ServerProcess
  let token = ""
  beforeAll(async () => {
    db = await pgDatabase(inject("pgUrl"))
    via = await PgProxy.start(db.url)
    await prepare()
    server = await serve([], {
      SCANFLEET_DATABASE_URL: via.url,
      SCANFLEET_ADMIN_TOKEN: adminToken,
      SCANFLEET_LOG_LEVEL: "info",
      SCANFLEET_POOL_SIZE: "4",
      SCANFLEET_PG_STATEMENT_TIMEOUT_MS: "2000"
    })
    const admin = (path: string, body: unknown) =>
      fetch(`${server.url}${path}`, { method: "POST", headers: { authorization: `Bearer ${adminToken}` }, body: JSON.stringify(body) })
    const d = await admin("/v1/admin/devices", { name: "stalled", slots: 8 })
    token = ((await d.json()) as { token: string }).token
    const t = await admin("/v1/admin/targets", { targets: Array.from({ length: 20 }, (_, i) => ({ source: "github", identity: `stall/repo-${i}` })), reason: "stall test" })
    expect(t.status).toBe(201)
  }, 120_000)
  afterAll(async () => {
    await server?.stop("SIGKILL")
    via?.close()
    await db?.cleanup()
  })

  const claim = (slot: number, signal?: AbortSignal) =>
    fetch(`${server.url}/v1/assignments/claim`, { method: "POST", headers: { authorization: `Bearer ${token}` }, body: JSON.stringify({ slot }), signal })

  it("held locks and thousands of requests given up: each request is answered within the statement timeout, and the server lives through the database's return and serves again", async () => {
    const locker = new pg.Client({ connectionString: db.url })
    await locker.connect()
    await locker.query("BEGIN")
    await locker.query("LOCK TABLE assignments IN ACCESS EXCLUSIVE MODE")
    try {
      // Clients that give up after 100 ms, as impatient devices and probes do: 3,000 of them.
      for (let wave = 0; wave < 10; wave++)
        await Promise.all(Array.from({ length: 300 }, (_, i) => claim(i % 8, AbortSignal.timeout(100)).then((r) => r.arrayBuffer(), () => undefined)))
      // A patient client gets its answer, a 503, once its statement has waited out the timeout (or no connection came).
      const started = Date.now()
      const patient = await claim(0, AbortSignal.timeout(30_000))
      expect([patient.status, ((await patient.json()) as { error?: string }).error]).toEqual([503, "store_unavailable"])
      expect(patient.headers.get("retry-after")).not.toBeNull()
      expect(Date.now() - started).toBeLessThan(10_000)
      // long enough for several sweeps to fail on the lock (each after the 2 s statement timeout)
      await new Promise((r) => setTimeout(r, 7_000))
    } finally {
      await locker.query("ROLLBACK")
      await locker.end()
    }
    // The database is back: the process is alive and claims again.
    await new Promise((r) => setTimeout(r, 1_000))
    expect(server.child.exitCode, server.output().slice(-2000)).toBeNull()
    let answered = 0
    for (let attempt = 0; attempt < 50 && answered === 0; attempt++) {
      const r = await claim(1, AbortSignal.timeout(10_000))
      if (r.status === 200) answered = 1
      else await new Promise((res) => setTimeout(res, 200))
    }
    expect(answered, server.output().slice(-2000)).toBe(1)
    expect(server.child.exitCode).toBeNull()
    // The outage is two lines of the sweeper's, not one a tick: the first failure, by its message, and the recovery with the count.
    await new Promise((r) => setTimeout(r, 2_000))
    const lines = server.output().split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as { message: string; level: string; failedSweeps?: number; error?: string })
    const sweeps = lines.filter((l) => l.message.startsWith("expiry sweep"))
    expect(sweeps.map((l) => [l.message, l.level]), JSON.stringify(sweeps)).toEqual([
      ["expiry sweep failed", "error"],
      ["expiry sweep recovered", "info"]
    ])
    expect(sweeps[0].error).toMatch(/database|statement/i)
    expect(sweeps[1].failedSweeps).toBeGreaterThanOrEqual(3)
  })

  it("a database that stops answering on open connections: a request is answered 503 within the statement timeout and the answer margin, and the next ones run on new connections", async () => {
    // warm: connections exist to be black-holed
    expect((await claim(2, AbortSignal.timeout(10_000))).status).toBe(200)
    via.blackHole()
    const started = Date.now()
    const stuck = await Promise.all(Array.from({ length: 4 }, (_, i) => claim(3 + i, AbortSignal.timeout(60_000))))
    for (const r of stuck) expect([200, 503]).toContain(r.status)
    // statement timeout 2 s, answer margin 10 s, and the time to find a connection
    expect(Date.now() - started).toBeLessThan(25_000)
    let ok = false
    for (let attempt = 0; attempt < 50 && !ok; attempt++) {
      const r = await claim(7, AbortSignal.timeout(20_000))
      ok = r.status === 200
      if (!ok) await new Promise((res) => setTimeout(res, 200))
    }
    expect(ok, server.output().slice(-2000)).toBe(true)
  })
})
