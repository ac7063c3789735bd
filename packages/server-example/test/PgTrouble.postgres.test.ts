import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest"
import { pgDatabase, pgQuery } from "./fixtures/Databases.js"
import * as PgProxy from "./fixtures/PgProxy.js"
import { prepare, serve, type ServerProcess } from "./fixtures/ServerProcess.js"

/**
 * A server process over a real PostgreSQL in trouble, reached through a TCP proxy that can
 * black-hole it or stop it: how it stops on SIGTERM, what `/readyz` says, and what it answers and
 * logs when the store refuses a request.
 */

const adminToken = "pg-trouble-admin-token-0123456789"

type Line = { readonly message: string; readonly level: string } & Record<string, unknown>

/** A server on a database of its own behind the proxy (pool of 4), with one registered device. */
const fleet = async (settings: Record<string, unknown> = {}) => {
  const db = await pgDatabase(inject("pgUrl"))
  const via = await PgProxy.start(db.url)
  const dir = mkdtempSync(join(tmpdir(), "scanfleet-pg-trouble-"))
  writeFileSync(join(dir, "settings.json"), JSON.stringify(settings))
  await prepare()
  const server = await serve(["--config", join(dir, "settings.json")], {
    SCANFLEET_DATABASE_URL: via.url,
    SCANFLEET_ADMIN_TOKEN: adminToken,
    SCANFLEET_LOG_LEVEL: "info",
    SCANFLEET_POOL_SIZE: "4"
  })
  const admin = (path: string, body: unknown, actor = "ci") =>
    fetch(`${server.url}${path}`, { method: "POST", headers: { authorization: `Bearer ${adminToken}`, "x-scanfleet-actor": actor }, body: JSON.stringify(body) })
  const { device: { id }, token } = (await (await admin("/v1/admin/devices", { name: "troubled", slots: 8 })).json()) as { device: { id: number }; token: string }
  const device = { id, token }
  expect((await admin("/v1/admin/targets", { targets: Array.from({ length: 20 }, (_, i) => ({ source: "github", identity: `trouble/repo-${i}` })), reason: "trouble test" })).status).toBe(201)
  const claim = (slot: number, signal?: AbortSignal) =>
    fetch(`${server.url}/v1/assignments/claim`, { method: "POST", headers: { authorization: `Bearer ${device.token}` }, body: JSON.stringify({ slot }), signal })
  /** A statement on the database itself, not through the proxy. */
  const direct = (text: string, values: Array<unknown> = []) => pgQuery(db.url, text, values)
  const lines = (): Array<Line> => server.output().split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as Line)
  return {
    db,
    via,
    server,
    device,
    admin,
    claim,
    direct,
    lines,
    cleanup: async () => {
      await server.stop("SIGKILL")
      via.close()
      await db.cleanup()
      rmSync(dir, { recursive: true, force: true })
    }
  }
}

type Fleet = Awaited<ReturnType<typeof fleet>>

const readyz = async (f: Fleet) => {
  const started = Date.now()
  const r = await fetch(`${f.server.url}/readyz`, { signal: AbortSignal.timeout(20_000) })
  const body = (await r.json()) as { ready: boolean; checks: Array<{ name: string; ok: boolean; detail: string }> }
  return { status: r.status, ms: Date.now() - started, database: body.checks.find((c) => c.name === "database")!, body }
}

describe("/readyz with a PostgreSQL whose pool is full, black-holed or stopped", { timeout: 180_000 }, () => {
  let f: Fleet
  beforeAll(async () => {
    f = await fleet()
  }, 120_000)
  afterAll(() => f?.cleanup())

  it("every pooled connection busy on long statements: 200, the database answering and busy; black-holed or stopped: 503 unreachable; back: 200", async () => {
    // Ready first, as a load balancer would see it before sending traffic: a sweep has finished and the schema was read.
    for (let i = 0; i < 400 && (await readyz(f)).status !== 200; i++) await new Promise((r) => setTimeout(r, 50))
    expect((await readyz(f)).status).toBe(200)
    // Each device registration sleeps 12 s in PostgreSQL: six of them hold the pool's four connections, two wait.
    await f.direct("CREATE FUNCTION slow_down() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(12); RETURN NEW; END $$")
    await f.direct("CREATE TRIGGER slow_down BEFORE INSERT ON devices FOR EACH ROW EXECUTE FUNCTION slow_down()")
    const registrations = Array.from({ length: 6 }, (_, i) => f.admin("/v1/admin/devices", { name: `slow-${i}`, slots: 1 }).then((r) => r.status, String))
    const sleeping = async () => (await f.direct("SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'"))[0].n
    for (let i = 0; i < 200 && (await sleeping()) < 4; i++) await new Promise((r) => setTimeout(r, 25))
    expect(await sleeping()).toBe(4)

    // Before, the probe's statement queued behind them and the database was reported unreachable.
    const busy = await readyz(f)
    expect([busy.status, busy.body.ready, busy.database.ok], JSON.stringify(busy.body)).toEqual([200, true, true])
    expect(busy.database.detail).toMatch(/^answers; busy: all 4 of 4 pooled connections in use/)
    expect(busy.ms).toBeLessThan(3_000)

    // The same full pool, the database black-holed: its connections and any new one carry nothing.
    f.via.silence()
    const silent = await readyz(f)
    expect([silent.status, silent.database.ok], JSON.stringify(silent.body)).toEqual([503, false])
    expect(silent.database.detail).toMatch(/^unreachable: /)
    expect(silent.ms).toBeLessThan(5_000)

    // Stopped: every connection closed, new ones refused.
    f.via.stop()
    const stopped = await readyz(f)
    expect([stopped.status, stopped.database.ok], JSON.stringify(stopped.body)).toEqual([503, false])
    expect(stopped.database.detail).toMatch(/^unreachable: /)
    expect(await Promise.all(registrations)).not.toContain(201)

    f.via.restore()
    let back = await readyz(f)
    for (let i = 0; i < 40 && back.status !== 200; i++) await new Promise((r) => setTimeout(r, 250)), (back = await readyz(f))
    expect([back.status, back.database.detail], JSON.stringify(back.body)).toEqual([200, "answers"])
  })
})

describe("a read-only PostgreSQL under a server process", { timeout: 180_000 }, () => {
  let f: Fleet
  beforeAll(async () => {
    f = await fleet()
  }, 120_000)
  afterAll(() => f?.cleanup())

  it("a write is answered 503 saying the database is read-only, with Retry-After, and each refusal is logged with its method, route, ids and caller, never a token", async () => {
    const claimed = (await (await f.claim(0)).json()) as { assignment: { reservationId: number; fence: number } }
    const { reservationId, fence } = claimed.assignment
    // What a standby, or an operator turning writes off, does to every new transaction; the server's connections are new ones after this.
    await f.direct(`ALTER DATABASE ${new URL(f.db.url).pathname.slice(1)} SET default_transaction_read_only = on`)
    await f.direct("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")

    const progress = () =>
      fetch(`${f.server.url}/v1/assignments/${reservationId}/progress`, {
        method: "POST",
        headers: { authorization: `Bearer ${f.device.token}` },
        body: JSON.stringify({ fence, events: [{ seq: 1, kind: "phase", phase: "assigned", at: Date.now() }] })
      })
    // The first request may still meet a connection the termination closed under it.
    let answer = await progress()
    let body = (await answer.json()) as { error: string; message: string }
    for (let i = 0; i < 20 && !/read-only/.test(body.message); i++) (answer = await progress()), (body = (await answer.json()) as { error: string; message: string })
    expect([answer.status, body.error], JSON.stringify(body)).toEqual([503, "store_unavailable"])
    expect(body.message).toMatch(/^the database is read-only/)
    expect(answer.headers.get("retry-after")).toBe("5")

    const added = await f.admin("/v1/admin/targets", { targets: [{ source: "github", identity: "trouble/read-only" }], reason: "read-only test" }, "alice")
    expect(added.status).toBe(503)
    expect(((await added.json()) as { message: string }).message).toMatch(/^the database is read-only/)

    const refusals = f.lines().filter((l) => l.message === "the store refused a request" && /read-only/.test(String(l.detail)))
    expect(refusals.find((l) => l.route === "/v1/assignments/:id/progress"), JSON.stringify(refusals)).toMatchObject({
      level: "warning",
      status: 503,
      error: "store_unavailable",
      method: "POST",
      params: { id: String(reservationId) },
      deviceId: f.device.id
    })
    expect(refusals.find((l) => l.route === "/v1/admin/targets"), JSON.stringify(refusals)).toMatchObject({ method: "POST", admin: "token", actor: "alice" })
    expect(f.server.output()).not.toContain(f.device.token)
    expect(f.server.output()).not.toContain(adminToken)
  })
})

describe("SIGTERM to a server whose PostgreSQL is black-holed", { timeout: 180_000 }, () => {
  const graceMs = 4_000
  let f: Fleet
  beforeAll(async () => {
    f = await fleet({ shutdownGraceMs: graceMs })
  }, 120_000)
  afterAll(() => f?.cleanup())

  it("exits 0 within shutdownGraceMs and the pool's close, naming in its last lines the requests, the sweep and the connections it left", async () => {
    // Four connections open in the pool: four requests held at once by a lock on the devices table.
    const locker = new pg.Client({ connectionString: f.db.url })
    await locker.connect()
    await locker.query("BEGIN")
    await locker.query("LOCK TABLE devices IN ACCESS EXCLUSIVE MODE")
    const held = Array.from({ length: 4 }, (_, i) => f.claim(i))
    const waiting = async () => (await f.direct("SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"))[0].n
    for (let i = 0; i < 200 && (await waiting()) < 4; i++) await new Promise((r) => setTimeout(r, 25))
    await locker.query("ROLLBACK")
    await locker.end()
    for (const r of await Promise.all(held)) expect(r.status).toBe(200)

    // The host is gone: every connection open or new carries nothing. Two claims and the sweeper's next statement wait on dead connections.
    f.via.silence()
    const stuck = [f.claim(4).then((r) => r.status, String), f.claim(5).then((r) => r.status, String)]
    await new Promise((r) => setTimeout(r, 2_000))

    const started = Date.now()
    f.server.child.kill("SIGTERM")
    const exited = await Promise.race([f.server.exited, new Promise<"still running">((r) => setTimeout(() => r("still running"), graceMs + 3_000))])
    // Before, it waited for the answer margin of the statements in flight (40 s), or for ever without a statement timeout.
    expect(exited, f.server.output().slice(-3000)).toBe(0)
    expect(Date.now() - started).toBeLessThan(graceMs + 3_000)
    await Promise.all(stuck)

    const last = f.lines().slice(-6)
    const message = (m: string) => last.find((l) => l.message === m)
    const at = (m: string) => last.findIndex((l) => l.message === m)
    expect(message("requests still in flight at shutdown; stopping without them"), JSON.stringify(last)).toMatchObject({
      level: "warning",
      inFlight: 2,
      requests: ["POST /v1/assignments/claim", "POST /v1/assignments/claim"]
    })
    expect(message("did not stop by the shutdown deadline; left behind"), JSON.stringify(last)).toMatchObject({ level: "warning", part: "expiry sweeper" })
    expect(message("server stopped"), JSON.stringify(last)).toMatchObject({ level: "warning", abandoned: expect.arrayContaining(["2 requests in flight", "expiry sweeper"]), graceMs })
    // the store closes after the server: its line comes last but for what the work left behind may still say
    const cut = message("closing the PostgreSQL pool: connections still busy were cut")
    expect(cut, JSON.stringify(last)).toMatchObject({ level: "warning", waitedMs: 1000 })
    expect(Number(cut!.busyConnections)).toBeGreaterThanOrEqual(1)
    expect(at("server stopped")).toBeLessThan(at("closing the PostgreSQL pool: connections still busy were cut"))
  })
})
