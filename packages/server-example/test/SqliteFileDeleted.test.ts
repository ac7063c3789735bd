import { rmSync } from "node:fs"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { sqliteFile } from "./fixtures/Databases.js"
import { prepare, serve, type ServerProcess } from "./fixtures/ServerProcess.js"

/**
 * The SQLite file deleted (with its -wal and -shm) under a running server: before, the
 * connection wrote on into the unlinked file, `/readyz` stayed 200, results were accepted
 * and lost, and a restart created an empty fleet. Now the server notices within a couple
 * of seconds: `/readyz` is 503 naming the deleted file, an error is logged, and writes
 * are refused 503 instead of accepted into a file nobody will read again.
 */

const adminToken = "sqlite-file-deleted-admin-token-0123"

const call = async (url: string, token: string, method: string, path: string, body?: unknown) => {
  const res = await fetch(url + path, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }), "x-scanfleet-actor": "test" },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(20_000)
  })
  const text = await res.text()
  let json: any = null
  try {
    json = JSON.parse(text)
  } catch {
    // not JSON: kept as null
  }
  return { status: res.status, body: json }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

describe("a SQLite server whose database file is deleted while it serves", { timeout: 120_000 }, () => {
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

  it("/readyz turns 503 naming the deleted file, an error is logged, and results and claims are refused 503 instead of accepted and lost", async () => {
    const added = await call(server.url, adminToken, "POST", "/v1/admin/targets", { targets: Array.from({ length: 10 }, (_, i) => ({ source: "github", identity: `gone/t-${i}` })), reason: "test" })
    expect(added.status, JSON.stringify(added.body)).toBe(201)
    const dev = await call(server.url, adminToken, "POST", "/v1/admin/devices", { name: "d", slots: 2 })
    expect(dev.status, JSON.stringify(dev.body)).toBe(201)
    const token = dev.body.token as string
    const claimed = await call(server.url, token, "POST", "/v1/assignments/claim", { slot: 0 })
    expect(claimed.status, JSON.stringify(claimed.body)).toBe(200)
    const a = claimed.body.assignment
    for (let i = 0; (await call(server.url, adminToken, "GET", "/readyz")).status !== 200; i++) {
      if (i > 100) throw new Error("the server was not ready within 10 s")
      await sleep(100)
    }

    for (const f of [file, `${file}-wal`, `${file}-shm`]) rmSync(f, { force: true })
    const deletedAt = Date.now()
    // Until the database check names the deletion (SQLite may refuse a statement on its own first).
    const databaseCheck = (r: { body: any }) => (r.body?.checks as Array<{ name: string; ok: boolean; detail: string }> | undefined)?.find((c) => c.name === "database")
    let ready = await call(server.url, adminToken, "GET", "/readyz")
    while (!(databaseCheck(ready)?.detail ?? "").includes("was deleted while open") && Date.now() - deletedAt < 10_000) {
      await sleep(200)
      ready = await call(server.url, adminToken, "GET", "/readyz")
    }
    expect(ready.status, JSON.stringify(ready.body)).toBe(503)
    expect(Date.now() - deletedAt).toBeLessThan(5000)
    const database = databaseCheck(ready)
    expect(database?.ok).toBe(false)
    expect(database?.detail).toContain(`${file} was deleted while open`)
    // The server's log line arrives through a pipe of its own, maybe after the answer.
    const logged = /"level":"error".*was deleted while open/
    for (let i = 0; !logged.test(server.output()) && i < 25; i++) await sleep(200)
    expect(server.output()).toMatch(logged)

    // The result is refused, not accepted into the unlinked file; so are claims and progress.
    const result = await call(server.url, token, "POST", `/v1/assignments/${a.reservationId}/result`, { fence: a.fence, outcome: "clean", finalPhase: null, findings: [] })
    expect(result.status, JSON.stringify(result.body)).toBe(503)
    expect(result.body.error).toBe("store_unavailable")
    const claim = await call(server.url, token, "POST", "/v1/assignments/claim", { slot: 1 })
    expect(claim.status, JSON.stringify(claim.body)).toBe(503)
    const progress = await call(server.url, token, "POST", `/v1/assignments/${a.reservationId}/progress`, { fence: a.fence, events: [{ seq: 1, kind: "phase", phase: "assigned", at: Date.now() }] })
    expect(progress.status, JSON.stringify(progress.body)).toBe(503)
    // /healthz (liveness) still answers: the process is alive and says why it is not ready.
    expect((await call(server.url, adminToken, "GET", "/healthz")).status).toBe(200)
  })
})
