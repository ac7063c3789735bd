import { Config } from "@scanfleet/core"
import { randomBytes } from "node:crypto"
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest"
import { addDevice, storeOn } from "./support/Fleet.js"
import { adminToken, type Answer, call, database, marked, type ServerProc, snapshot, startServer } from "./support/Procs.js"

/**
 * Intruders against a real server process on its own PostgreSQL database:
 * every Worker API and admin endpoint with no token, a wrong token, another
 * device's token, a revoked device's token, the wrong kind of token, and
 * replays with a stale fence. Each is refused with 401 or 403, the database is
 * byte-for-byte the same afterwards, and no token ever shows up in the
 * server's logs or in an error body.
 */

let db: Awaited<ReturnType<typeof database>>
let server: ServerProc
let store: ReturnType<typeof storeOn>
let a: { id: number; token: string }
let b: { id: number; token: string }
let revoked: { id: number; token: string }
/** A's live reservation, and one of A's it released earlier (with the fence it had). */
let live: { reservationId: number; fence: number }
let released: { reservationId: number; fence: number; lastSeq: number }
/** The revoked device's reservation. */
let orphaned: { reservationId: number; fence: number }
const wrongTokens = [`sfd_${randomBytes(32).toString("base64url")}`, "x", `${adminToken}x`, "sfd_" + "A".repeat(43)]
const bodies: Array<string> = []

const claimAs = async (token: string, slot = 0) => {
  const r = await call(server.url, "POST", "/v1/assignments/claim", { token, body: { slot } })
  if (r.status !== 200 || !r.body.assignment) throw new Error(`claim failed: ${r.status} ${r.text}`)
  return r.body.assignment as { reservationId: number; fence: number }
}

beforeAll(async () => {
  db = await database(inject("pgUrl"))
  server = await startServer({ databaseUrl: db.url, logLevel: "debug" })
  store = storeOn(db.url)
  await store.seed(Array.from({ length: 12 }, (_, i) => `intruders/repo-${i}`))
  a = await addDevice(server.url, "device-a", 4)
  b = await addDevice(server.url, "device-b", 4)
  revoked = await addDevice(server.url, "device-revoked", 2)
  // A claims, reports one phase and gives the reservation back: its fence is now stale.
  const first = await claimAs(a.token, 0)
  const p = await call(server.url, "POST", `/v1/assignments/${first.reservationId}/progress`, { token: a.token, body: { fence: first.fence, events: [{ seq: 1, kind: "phase", phase: "assigned", at: Date.now() }] } })
  expect(p.status).toBe(200)
  const rel = await call(server.url, "POST", `/v1/assignments/${first.reservationId}/release`, { token: a.token, body: { fence: first.fence } })
  expect(rel.status).toBe(200)
  released = { ...first, lastSeq: 1 }
  live = await claimAs(a.token, 1)
  orphaned = await claimAs(revoked.token, 0)
  const rv = await call(server.url, "DELETE", `/v1/admin/devices/${revoked.id}`, { token: adminToken })
  expect(rv.status).toBe(200)
}, 240_000)

afterAll(async () => {
  await store?.close()
  await server?.kill("SIGTERM")
  await db?.drop()
  expect(marked()).toEqual([])
})

/** One request an intruder can make; `own` is the token its rightful caller would use. */
interface Attempt {
  readonly name: string
  readonly method: "GET" | "POST" | "DELETE"
  readonly path: () => string
  readonly body?: () => unknown
  readonly kind: "worker" | "admin"
}

const events = (from: number, n = 1) => Array.from({ length: n }, (_, i) => ({ seq: from + i, kind: "phase", phase: i === 0 ? "permit_wait" : "preparing", at: Date.now() }))
const result = (fence: number) => ({ fence, outcome: "clean", finalPhase: "staging", findings: [{ rule: "x" }], log: "" })

const workerEndpoints: ReadonlyArray<Attempt> = [
  { name: "claim", method: "POST", path: () => "/v1/assignments/claim", body: () => ({ slot: 2 }), kind: "worker" },
  { name: "progress", method: "POST", path: () => `/v1/assignments/${live.reservationId}/progress`, body: () => ({ fence: live.fence, events: events(1) }), kind: "worker" },
  { name: "result", method: "POST", path: () => `/v1/assignments/${live.reservationId}/result`, body: () => result(live.fence), kind: "worker" },
  { name: "release", method: "POST", path: () => `/v1/assignments/${live.reservationId}/release`, body: () => ({ fence: live.fence }), kind: "worker" },
  { name: "get assignment", method: "GET", path: () => `/v1/assignments/${live.reservationId}`, kind: "worker" }
]

const goodConfig = { ...Config.defaults, assignments: { ...Config.defaults.assignments, globalTtlSeconds: 7200 } }
const adminEndpoints: ReadonlyArray<Attempt> = [
  { name: "config preview", method: "POST", path: () => "/v1/admin/config/preview", body: () => goodConfig, kind: "admin" },
  { name: "config apply", method: "POST", path: () => "/v1/admin/config/apply", body: () => goodConfig, kind: "admin" },
  { name: "config", method: "GET", path: () => "/v1/admin/config", kind: "admin" },
  { name: "add device", method: "POST", path: () => "/v1/admin/devices", body: () => ({ name: "intruder", slots: 64 }), kind: "admin" },
  { name: "revoke device", method: "DELETE", path: () => `/v1/admin/devices/${b.id}`, kind: "admin" },
  { name: "assignments", method: "GET", path: () => "/v1/admin/assignments", kind: "admin" },
  { name: "assignment", method: "GET", path: () => `/v1/admin/assignments/${live.reservationId}`, kind: "admin" },
  { name: "cycles", method: "GET", path: () => "/v1/admin/cycles", kind: "admin" },
  { name: "targets", method: "GET", path: () => "/v1/admin/targets", kind: "admin" },
  { name: "percentiles", method: "GET", path: () => "/v1/admin/percentiles", kind: "admin" },
  { name: "summary", method: "GET", path: () => "/v1/admin/summary", kind: "admin" }
]
const every = [...workerEndpoints, ...adminEndpoints]

/** Sends `attempt` with `token` (or a raw Authorization header) and checks the refusal and that nothing changed. */
const refused = async (attempt: Attempt, auth: { token?: string | null; header?: string }, expected: ReadonlyArray<number>): Promise<Answer> => {
  const before = await snapshot(db.url)
  const r = await call(server.url, attempt.method, attempt.path(), {
    token: auth.token ?? null,
    ...(auth.header ? { headers: { authorization: auth.header } } : {}),
    ...(attempt.body ? { body: attempt.body() } : {})
  })
  bodies.push(r.text)
  expect(expected, `${attempt.method} ${attempt.path()} answered ${r.status} ${r.text}`).toContain(r.status)
  expect(typeof r.body.error, r.text).toBe("string")
  expect(await snapshot(db.url), `${attempt.name} changed the database`).toEqual(before)
  return r
}

describe("intruders are refused and change nothing", () => {
  it.each(every.map((e) => [e.name, e] as const))("%s with no token, a malformed header or a wrong token: 401, no change", async (_name, attempt) => {
    await refused(attempt, { token: null }, [401])
    await refused(attempt, { header: `Basic ${Buffer.from(`admin:${adminToken}`).toString("base64")}` }, [401])
    await refused(attempt, { header: "Bearer" }, [401])
    for (const t of wrongTokens) await refused(attempt, { token: t }, [401])
  })

  it.each(every.map((e) => [e.name, e] as const))("%s with a revoked device's token: 401, no change", async (_name, attempt) => {
    await refused(attempt, { token: revoked.token }, [401])
  })

  it.each(adminEndpoints.map((e) => [e.name, e] as const))("admin %s with a device token: 403, no change", async (_name, attempt) => {
    await refused(attempt, { token: a.token }, [403])
  })

  it.each(workerEndpoints.map((e) => [e.name, e] as const))("worker %s with the admin token: 403, no change", async (_name, attempt) => {
    await refused(attempt, { token: adminToken }, [403])
  })

  it.each(workerEndpoints.filter((e) => e.name !== "claim").map((e) => [e.name, e] as const))("worker %s on another device's reservation: 403, no change", async (_name, attempt) => {
    const r = await refused(attempt, { token: b.token }, [403])
    expect(r.body.error).toBe("reservation_refused:not_owner")
  })

  it("the revoked device's own reservation stays untouchable: progress, result and release with its token get 401", async () => {
    const id = orphaned.reservationId
    const on = (name: string, path: string, body: unknown): Attempt => ({ name, method: "POST", path: () => path, body: () => body, kind: "worker" })
    await refused(on("progress", `/v1/assignments/${id}/progress`, { fence: orphaned.fence, events: events(1) }), { token: revoked.token }, [401])
    await refused(on("result", `/v1/assignments/${id}/result`, result(orphaned.fence)), { token: revoked.token }, [401])
    await refused(on("release", `/v1/assignments/${id}/release`, { fence: orphaned.fence }), { token: revoked.token }, [401])
  })

  it("replays with a stale fence are refused with 403 and change nothing: on a released reservation, and on a live one with an older fence", async () => {
    const rid = released.reservationId
    const replay = (name: string, path: string, body: unknown): Attempt => ({ name, method: "POST", path: () => path, body: () => body, kind: "worker" })
    // The released reservation: its owner's fence no longer holds authority.
    await refused(replay("progress", `/v1/assignments/${rid}/progress`, { fence: released.fence, events: events(released.lastSeq + 1) }), { token: a.token }, [403])
    await refused(replay("result", `/v1/assignments/${rid}/result`, result(released.fence)), { token: a.token }, [403])
    await refused(replay("release", `/v1/assignments/${rid}/release`, { fence: released.fence }), { token: a.token }, [403])
    // The live reservation, addressed with fences other than its own.
    for (const fence of [live.fence - 1, 0, live.fence + 1]) {
      const lid = live.reservationId
      const r1 = await refused(replay("progress", `/v1/assignments/${lid}/progress`, { fence, events: events(1) }), { token: a.token }, [403])
      expect(r1.body.issues?.[0]?.path ?? ["fence"]).toEqual(["fence"])
      await refused(replay("result", `/v1/assignments/${lid}/result`, result(fence)), { token: a.token }, [403])
      await refused(replay("release", `/v1/assignments/${lid}/release`, { fence }), { token: a.token }, [403])
    }
  })

  it("the dashboard refuses a wrong token in the address or cookie with 401", async () => {
    for (const t of wrongTokens) {
      const before = await snapshot(db.url)
      const q = await call(server.url, "GET", `/?token=${encodeURIComponent(t)}`)
      expect(q.status).toBe(401)
      const c = await call(server.url, "GET", "/", { headers: { cookie: `scanfleet_admin=${encodeURIComponent(t)}` } })
      expect(c.status).toBe(401)
      const d = await call(server.url, "GET", "/", { headers: { cookie: `scanfleet_admin=${encodeURIComponent(a.token)}` } })
      expect(d.status === 401 || d.status === 403).toBe(true)
      bodies.push(q.text, c.text, d.text)
      expect(await snapshot(db.url)).toEqual(before)
    }
  })

  it("no token, right or wrong, appears in the server's logs or in any error body", async () => {
    // Give the last log lines time to be written.
    await new Promise((r) => setTimeout(r, 300))
    const logs = server.output()
    expect(logs).toContain("\"status\":401")
    expect(logs).toContain("\"status\":403")
    const secrets = [adminToken, a.token, b.token, revoked.token, ...wrongTokens.filter((t) => t.length > 8)]
    for (const s of secrets) {
      expect(logs.includes(s), "a token appears in the server's output").toBe(false)
      for (const body of bodies) expect(body.includes(s), "a token appears in an error body").toBe(false)
    }
    // Their stored form neither: only a SHA-256 hash of each device token is kept, and it is not logged.
    const { createHash } = await import("node:crypto")
    for (const s of [a.token, b.token, revoked.token]) expect(logs.includes(createHash("sha256").update(s).digest("hex"))).toBe(false)
  })
})
