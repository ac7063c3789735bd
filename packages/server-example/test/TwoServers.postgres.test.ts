import { Store } from "@scanfleet/core"
import { Effect, ManagedRuntime } from "effect"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest"
import * as Database from "../src/Database.js"
import { pgDatabase } from "./fixtures/Databases.js"
import { prepare, serve, type ServerProcess } from "./fixtures/ServerProcess.js"

const adminToken = "two-servers-admin-token-0123456789"
const phases = ["assigned", "preparing", "scanning", "cleanup", "staging", "bundling", "uploading", "awaiting_receipt"]
const TARGETS = 48
const DEVICES = 6
const SLOTS = 2

describe("two server processes on one PostgreSQL", { timeout: 240_000 }, () => {
  let db: Awaited<ReturnType<typeof pgDatabase>>
  let servers: Array<ServerProcess> = []
  let rt: ManagedRuntime.ManagedRuntime<Store.Store, unknown>
  beforeAll(async () => {
    db = await pgDatabase(inject("pgUrl"))
    await prepare()
    // Both start at once: their migrations race on the same empty database.
    const env = { SCANFLEET_DATABASE_URL: db.url, SCANFLEET_ADMIN_TOKEN: adminToken, SCANFLEET_LOG_LEVEL: "info", SCANFLEET_POOL_SIZE: "8" }
    // One runs its hot statements prepared (the default), the other unnamed, as behind a transaction pooler.
    servers = await Promise.all([serve([], env, 180_000), serve([], { ...env, SCANFLEET_PG_PREPARE: "off" }, 180_000)])
    rt = ManagedRuntime.make(Database.layer(db.url, { poolSize: 2 }))
  }, 240_000)
  afterAll(async () => {
    for (const s of servers) await s.stop("SIGKILL")
    await rt?.dispose()
    await db?.cleanup()
  })

  it("many concurrent claim and progress clients: no target is claimed twice, no event is lost or duplicated", async () => {
    const now = Date.now()
    await rt.runPromise(
      Effect.flatMap(Store.Store, (s) =>
        s.recordObservations(
          Array.from({ length: TARGETS }, (_, i) => ({ source: (["github", "gitlab", "huggingface", "dockerhub"] as const)[i % 4], identity: `org/repo-${i}`, remoteAt: i % 4 === 3 ? null : now - i })),
          now
        )
      )
    )
    const pick = () => servers[Math.floor(Math.random() * servers.length)].url
    const call = async (token: string, path: string, body?: unknown): Promise<{ status: number; body: any }> => {
      // Retries on server errors and dropped connections, as a device would.
      for (let attempt = 0; ; attempt++) {
        try {
          const res = await fetch(pick() + path, { method: body === undefined ? "GET" : "POST", headers: { authorization: `Bearer ${token}` }, body: body === undefined ? undefined : JSON.stringify(body) })
          const json = (await res.json()) as any
          if (res.status < 500 || attempt >= 5) return { status: res.status, body: json }
        } catch (e) {
          if (attempt >= 5) throw e
        }
        await new Promise((r) => setTimeout(r, 20 * (attempt + 1)))
      }
    }
    const devices = await Promise.all(
      Array.from({ length: DEVICES }, async (_, i) => {
        const r = await fetch(`${servers[i % 2].url}/v1/admin/devices`, { method: "POST", headers: { authorization: `Bearer ${adminToken}` }, body: JSON.stringify({ name: `dev-${i}`, slots: SLOTS }) })
        expect(r.status).toBe(201)
        return ((await r.json()) as { token: string }).token
      })
    )

    const claimed: Array<{ reservationId: number; identity: string }> = []
    const acceptances = new Map<string, Array<string>>()
    const sent = new Map<number, Array<string>>()
    const unexpected: Array<string> = []
    const slotLoop = async (token: string, slot: number) => {
      for (;;) {
        const c = await call(token, "/v1/assignments/claim", { slot })
        if (c.status !== 200) {
          unexpected.push(`claim ${c.status} ${JSON.stringify(c.body)}`)
          return
        }
        const a = c.body.assignment
        if (a === null) return
        claimed.push({ reservationId: a.reservationId, identity: `${a.target.source}:${a.target.identity}` })
        const t0 = Date.now()
        const events = phases.map((phase, i) => ({ seq: i + 1, kind: "phase", phase, at: t0 + i }))
        sent.set(a.reservationId, phases)
        for (let i = 0; i < events.length; ) {
          const n = 1 + Math.floor(Math.random() * 3)
          const batch = events.slice(Math.max(0, i - 1), i + n) // overlaps the previous batch: a retry of its last event
          // The same batch to both servers at once, as a device whose first attempt timed out would.
          const rs = await Promise.all([call(token, `/v1/assignments/${a.reservationId}/progress`, { fence: a.fence, events: batch }), call(token, `/v1/assignments/${a.reservationId}/progress`, { fence: a.fence, events: batch })])
          for (const r of rs) {
            if (r.status !== 200) {
              unexpected.push(`progress ${r.status} ${JSON.stringify(r.body)}`)
              continue
            }
            expect(r.body.assignmentExpiry).toBe(a.deadlines.assignmentExpiry.at)
            for (const x of r.body.results) {
              const k = `${a.reservationId}/${x.seq}`
              acceptances.set(k, [...(acceptances.get(k) ?? []), x.status])
            }
          }
          i += n
        }
        const res = await call(token, `/v1/assignments/${a.reservationId}/result`, { fence: a.fence, outcome: "clean", finalPhase: "awaiting_receipt", findings: [] })
        if (res.status !== 200) unexpected.push(`result ${res.status} ${JSON.stringify(res.body)}`)
      }
    }
    await Promise.all(devices.flatMap((token) => Array.from({ length: SLOTS }, (_, slot) => slotLoop(token, slot))))

    expect(unexpected).toEqual([])
    // No double claim: every target exactly once.
    expect(claimed).toHaveLength(TARGETS)
    expect(new Set(claimed.map((c) => c.identity)).size).toBe(TARGETS)
    // Exactly one acceptance per (reservation, sequence); every other answer is a duplicate.
    for (const [k, statuses] of acceptances) expect(statuses.filter((s) => s === "accepted"), k).toHaveLength(1)
    // The stored timelines: every event once, in order, nothing lost.
    for (const c of claimed) {
      const tl = await rt.runPromise(Effect.flatMap(Store.Store, (s) => s.timeline(c.reservationId)))
      expect(tl.map((e) => e.seq)).toEqual(phases.map((_, i) => i + 1))
      expect(tl.map((e) => e.phase)).toEqual(sent.get(c.reservationId))
    }
    const counts = await rt.runPromise(Effect.flatMap(Store.Store, (s) => s.countTargets()))
    expect(counts.filter((c) => c.status !== "completed")).toEqual([])
    // Both instances report the same fleet.
    const summaries = await Promise.all(servers.map(async (s) => (await (await fetch(`${s.url}/v1/admin/summary`, { headers: { authorization: `Bearer ${adminToken}` } })).json()) as any))
    expect(summaries[0].assignments.completed).toBe(TARGETS)
    expect(summaries[1].assignments.completed).toBe(TARGETS)
  })

  it("SIGTERM: each instance exits 0 and closes its connection pool", async () => {
    const codes = await Promise.all(servers.map((s) => s.stop("SIGTERM")))
    expect(codes).toEqual([0, 0])
    for (const s of servers) expect(s.output()).toContain('"message":"server stopped"')
    await rt.dispose()
    const c = new pg.Client({ connectionString: inject("pgUrl") })
    await c.connect()
    try {
      let n = -1
      for (let i = 0; i < 50 && n !== 0; i++) {
        n = Number((await c.query("SELECT count(*) AS n FROM pg_stat_activity WHERE datname = $1", [new URL(db.url).pathname.slice(1)])).rows[0].n)
        if (n !== 0) await new Promise((r) => setTimeout(r, 100))
      }
      expect(n).toBe(0)
    } finally {
      await c.end()
    }
  })
})
