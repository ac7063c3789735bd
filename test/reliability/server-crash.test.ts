import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, inject, it, vi } from "vitest"
import { addDevice, applyConfig, storeOn } from "./support/Fleet.js"
import { violations } from "./support/Invariants.js"
import { adminToken, type Answer, call, database, marked, type ServerProc, startServer, until, withPg } from "./support/Procs.js"

/**
 * Two server processes on one PostgreSQL database; one is killed with
 * SIGKILL while devices claim, report progress and upload results, and the
 * devices retry against the other. Then PostgreSQL itself kills the servers'
 * connections in the middle of their transactions. Finally a server on a
 * SQLite file dies mid-write and restarts on the same file. Throughout: no
 * target claimed twice, no reservation lost, no event duplicated or
 * reordered, a resubmitted result answered with its original receipt.
 */

// Each test starts real processes; on a loaded machine that alone can take a minute.
vi.setConfig({ testTimeout: 180_000 })

let db: Awaited<ReturnType<typeof database>>
let store: ReturnType<typeof storeOn>
const servers: Array<ServerProc> = []
const dir = mkdtempSync(join(tmpdir(), "scanfleet-server-crash-"))

beforeAll(async () => {
  db = await database(inject("pgUrl"))
  servers.push(await startServer({ databaseUrl: db.url, logLevel: "warning", poolSize: 8 }), await startServer({ databaseUrl: db.url, logLevel: "warning", poolSize: 8 }))
  store = storeOn(db.url)
  await applyConfig(servers[0].url, { scan: 600, upload: 120, ttl: 900 })
}, 240_000)

afterAll(async () => {
  await store?.close()
  for (const s of servers) await s.kill("SIGTERM")
  await db?.drop()
  rmSync(dir, { recursive: true, force: true })
  expect(marked()).toEqual([])
})

/** A device that tries each live server in turn, retrying network failures and 5xx answers. */
const resilient = (urls: () => ReadonlyArray<string>, stats: { retries: number }) => async (token: string, method: string, path: string, body?: unknown): Promise<Answer> => {
  let last = ""
  for (let attempt = 0; attempt < 200; attempt++) {
    for (const url of urls()) {
      try {
        const r = await call(url, method, path, { token, ...(body !== undefined ? { body } : {}) })
        if (r.status < 500) return r
        last = `${url}: ${r.status} ${r.text}`
      } catch (e) {
        // connection refused or cut: the next server, or the next round
        last = `${url}: ${String(e)}`
      }
      stats.retries++
    }
    await new Promise((r) => setTimeout(r, 25))
  }
  throw new Error(`${method} ${path}: no server answered; the last answer was ${last}`)
}

/** Kills `server` once `n` of the answers counted by `seen` have come back. */
const killAfter = (server: ServerProc, n: number, seen: { count: number }) =>
  until(`${n} answers`, () => seen.count >= n, 30_000, 2).then(() => server.child.kill("SIGKILL"))

const phases = ["assigned", "permit_wait", "preparing", "scanning", "staging"] as const

describe("server processes die and the database drops connections; nothing is lost or doubled", () => {
  it("kill -9 of one of two servers during claims, progress and result uploads: no double claim, no lost reservation, no duplicated event, original receipts", async () => {
    const N = 40
    await store.seed(Array.from({ length: N + 20 }, (_, i) => `server-crash/repo-${i}`))
    const devices = await Promise.all(Array.from({ length: N }, (_, i) => addDevice(servers[0].url, `dev-${i}`, 1)))
    const stats = { retries: 0 }
    const live = () => servers.filter((s) => s.alive()).map((s) => s.url)
    const send = resilient(live, stats)

    // Claims: all at once through the first server, which dies part-way.
    const seen = { count: 0 }
    let victim = servers[0]
    const killing = killAfter(victim, 10, seen)
    const claims = await Promise.all(
      devices.map(async (d) => {
        const r = await send(d.token, "POST", "/v1/assignments/claim", { slot: 0 })
        seen.count++
        return { d, r }
      })
    )
    await killing
    await victim.exited
    const held = new Map<number, { reservationId: number; fence: number }>()
    const busy = new Map<number, { reservationId: number; fence: number }>()
    for (const { d, r } of claims) {
      if (r.status === 200 && r.body.assignment) held.set(d.id, r.body.assignment)
      else if (r.status === 409 && r.body.error === "claim_rejected:slot_busy") busy.set(d.id, r.body.holder)
      else expect.fail(`claim for device ${d.id}: ${r.status} ${r.text}`)
    }
    // A claim whose answer died with the server is not lost: the slot holds it until its immutable expiry,
    // and a retry's refusal names it, so the device can give it back.
    const active = await withPg(db.url, (c) =>
      c.query(`SELECT device_id::int AS d, reservation_id::int AS "reservationId", fence::int AS fence FROM assignments WHERE state = 'active' ORDER BY device_id`)
    )
    expect(active.rows.length).toBe(N)
    expect(new Set(active.rows.map((r) => r.d)).size).toBe(N)
    expect(held.size + busy.size).toBe(N)
    const activeOf = new Map(active.rows.map((r) => [r.d, { reservationId: r.reservationId, fence: r.fence }]))
    for (const [deviceId, holder] of busy) expect(holder).toEqual(activeOf.get(deviceId))
    expect(await violations(db.url)).toEqual([])

    servers[0] = await startServer({ databaseUrl: db.url, logLevel: "warning", poolSize: 8 })

    // Progress: five single-event batches per reservation, in order; the first server dies again part-way.
    seen.count = 0
    victim = servers[0]
    const killing2 = killAfter(victim, 40, seen)
    await Promise.all(
      [...held.entries()].map(async ([deviceId, a]) => {
        const d = devices.find((x) => x.id === deviceId)!
        for (let seq = 1; seq <= phases.length; seq++) {
          const r = await send(d.token, "POST", `/v1/assignments/${a.reservationId}/progress`, { fence: a.fence, events: [{ seq, kind: "phase", phase: phases[seq - 1], at: Date.now() }] })
          expect(r.status, r.text).toBe(200)
          expect(["accepted", "duplicate"]).toContain(r.body.results[0].status)
          seen.count++
        }
      })
    )
    await killing2
    await victim.exited
    expect(await violations(db.url)).toEqual([])
    const timelines = await withPg(db.url, (c) => c.query(`SELECT reservation_id::int AS r, array_agg(seq ORDER BY seq) AS seqs FROM progress_events GROUP BY reservation_id`))
    expect(timelines.rows.length).toBe(held.size)
    for (const row of timelines.rows) expect(row.seqs).toEqual([1, 2, 3, 4, 5])

    servers[0] = await startServer({ databaseUrl: db.url, logLevel: "warning", poolSize: 8 })

    // Results: uploaded through the first server, which dies part-way; each retry gets the original receipt.
    seen.count = 0
    victim = servers[0]
    const killing3 = killAfter(victim, 10, seen)
    const receipts = new Map<number, string>()
    await Promise.all(
      [...held.entries()].map(async ([deviceId, a]) => {
        const d = devices.find((x) => x.id === deviceId)!
        const r = await send(d.token, "POST", `/v1/assignments/${a.reservationId}/result`, { fence: a.fence, outcome: "clean", finalPhase: "staging", findings: [], log: "" })
        expect(r.status, r.text).toBe(200)
        receipts.set(a.reservationId, r.body.receiptId)
        seen.count++
      })
    )
    await killing3
    await victim.exited
    servers[0] = await startServer({ databaseUrl: db.url, logLevel: "warning", poolSize: 8 })
    for (const [deviceId, a] of held) {
      const d = devices.find((x) => x.id === deviceId)!
      const again = await call(servers[0].url, "POST", `/v1/assignments/${a.reservationId}/result`, { token: d.token, body: { fence: a.fence, outcome: "clean", finalPhase: "staging", findings: [], log: "" } })
      expect(again.status, again.text).toBe(200)
      expect(again.body.receiptId).toBe(receipts.get(a.reservationId))
    }
    // one stored result per reservation, each on its reservation's row
    const results = await withPg(db.url, (c) => c.query(`SELECT count(*)::int AS n, count(DISTINCT reservation_id)::int AS k FROM assignments WHERE result_body IS NOT NULL`))
    expect(results.rows[0]).toEqual({ n: held.size, k: held.size })
    expect(await violations(db.url)).toEqual([])
    // The kills landed on requests in flight: some were retried on the other server.
    expect(stats.retries).toBeGreaterThan(0)
  })

  it("PostgreSQL terminates the servers' backends mid-transaction, over and over: transactions roll back, the servers recover, invariants hold", async () => {
    await store.seed(Array.from({ length: 60 }, (_, i) => `terminate/repo-${i}`))
    const devices = await Promise.all(Array.from({ length: 10 }, (_, i) => addDevice(servers[1].url, `term-${i}`, 2)))
    const stats = { retries: 0 }
    const send = resilient(() => servers.map((s) => s.url), stats)
    let terminated = 0
    const until4 = Date.now() + 4000
    // The terminator runs for a bounded window; work still in flight afterwards completes against healthy pools.
    const terminator = (async () => {
      while (Date.now() < until4) {
        const r = await withPg(db.url, (c) =>
          c.query(`SELECT pg_terminate_backend(pid) AS t FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')`, [db.name])
        ).catch(() => ({ rows: [] as Array<{ t: boolean }> }))
        terminated += r.rows.filter((x) => x.t).length
        await new Promise((res) => setTimeout(res, 15))
      }
    })()
    // Each device works through its slots: claim, five events, result, while the terminator runs.
    const completed: Array<number> = []
    await Promise.all(
      devices.flatMap((d) =>
        [0, 1].map(async (slot) => {
          while (Date.now() < until4) {
            const c = await send(d.token, "POST", "/v1/assignments/claim", { slot })
            if (c.status === 409) {
              // A claim committed before its connection died: the slot is held until expiry; use the other slot's turn.
              await new Promise((r) => setTimeout(r, 50))
              continue
            }
            expect(c.status, c.text).toBe(200)
            const a = c.body.assignment
            if (!a) break
            for (let seq = 1; seq <= phases.length; seq++) {
              const r = await send(d.token, "POST", `/v1/assignments/${a.reservationId}/progress`, { fence: a.fence, events: [{ seq, kind: "phase", phase: phases[seq - 1], at: Date.now() }] })
              expect(r.status, r.text).toBe(200)
            }
            const r = await send(d.token, "POST", `/v1/assignments/${a.reservationId}/result`, { fence: a.fence, outcome: "clean", finalPhase: "staging", findings: [], log: "" })
            expect(r.status, r.text).toBe(200)
            completed.push(a.reservationId)
          }
        })
      )
    )
    await terminator
    expect(terminated).toBeGreaterThan(0)
    expect(completed.length).toBeGreaterThan(0)
    expect(await violations(db.url)).toEqual([])
    // Both servers serve again without a restart.
    for (const s of servers) {
      expect(s.alive(), `a server died:\n${s.output()}`).toBe(true)
      const r = await call(s.url, "GET", "/v1/admin/summary", { token: adminToken })
      expect(r.status, r.text).toBe(200)
    }
    const ended = await withPg(db.url, (c) => c.query(`SELECT count(*)::int AS n FROM assignments WHERE reservation_id = ANY($1) AND state = 'completed'`, [completed]))
    expect(ended.rows[0].n).toBe(completed.length)
  })

  it("a server on a SQLite file killed mid-write restarts on the same file with nothing torn or doubled", async () => {
    const file = join(dir, "crash.db")
    let s = await startServer({ databaseUrl: `sqlite:${file}`, logLevel: "warning" })
    await applyConfig(s.url, { scan: 600, upload: 120, ttl: 900 })
    const device = await addDevice(s.url, "sqlite-writer", 1)
    const writes: Array<Promise<Answer | null>> = []
    // Device registrations (one row each) fired continuously; the process dies under them.
    for (let i = 0; i < 300; i++) writes.push(call(s.url, "POST", "/v1/admin/devices", { token: adminToken, body: { name: `w-${i}`, slots: 1 } }).catch(() => null))
    await new Promise((r) => setTimeout(r, 60))
    s.child.kill("SIGKILL")
    await s.exited
    const answers = await Promise.all(writes)
    const acked = answers.filter((a) => a?.status === 201).map((a) => a!.body as { device: { id: number }; token: string })
    const acknowledged = acked.map((a) => a.device.id)
    s = await startServer({ databaseUrl: `sqlite:${file}`, logLevel: "warning" })
    try {
      // Every acknowledged write survived the crash; the old device still authenticates; the file takes new writes.
      const check = await call(s.url, "POST", "/v1/assignments/claim", { token: device.token, body: { slot: 0 } })
      expect(check.status, check.text).toBe(200)
      // Each device whose registration was answered before the crash still authenticates (404: known device, no such reservation).
      for (const a of acked) expect((await call(s.url, "GET", "/v1/assignments/999999", { token: a.token })).status).toBe(404)
      const more = await call(s.url, "POST", "/v1/admin/devices", { token: adminToken, body: { name: "after", slots: 1 } })
      expect(more.status).toBe(201)
      expect(more.body.device.id).toBeGreaterThan(Math.max(device.id, ...acknowledged))
    } finally {
      await s.kill("SIGTERM")
    }
  })
})
