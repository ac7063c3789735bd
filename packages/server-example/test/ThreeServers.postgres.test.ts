import * as FakeSources from "@scanfleet/adapters/testing/FakeSources"
import { Config, Store } from "@scanfleet/core"
import { Effect, ManagedRuntime } from "effect"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest"
import * as Database from "../src/Database.js"
import { pgDatabase, pgQuery } from "./fixtures/Databases.js"
import { prepare, serve, type ServerProcess } from "./fixtures/ServerProcess.js"

const adminToken = "three-servers-admin-token-0123456789"
const REPOS = 40
const BUDGET = 3
const LEASE_MS = 2000
const POLL_MS = LEASE_MS / 10

describe("three server processes on one PostgreSQL, discovery running in all", { timeout: 240_000 }, () => {
  let db: Awaited<ReturnType<typeof pgDatabase>>
  let fakes: FakeSources.FakeSources
  let servers: Array<ServerProcess> = []
  let rt: ManagedRuntime.ManagedRuntime<Store.Store, unknown>
  let dir: string
  const query = (text: string, values: Array<unknown> = []) => pgQuery(db.url, text, values)
  beforeAll(async () => {
    db = await pgDatabase(inject("pgUrl"))
    fakes = await FakeSources.start()
    rt = ManagedRuntime.make(Database.layer(db.url, { poolSize: 2 }))
    // Every repository scanned once, a day ago; the listing now shows each one pushed since.
    const t0 = Date.now() - 86_400_000
    await rt.runPromise(
      Effect.gen(function* () {
        const s = yield* Store.Store
        yield* s.applyConfig({ ...Config.defaults, sources: { ...Config.defaults.sources, github: { ...Config.defaults.sources.github, promotionBudget: BUDGET, cooldownSeconds: 0 } } }, "test", t0)
        yield* s.recordObservations(Array.from({ length: REPOS }, (_, i) => ({ source: "github" as const, identity: `acme/r${i}`, remoteAt: t0 - 60_000 })), t0)
        const d = yield* s.addDevice({ name: "seed", slots: REPOS, tokenHash: "seed", now: t0 })
        const as = yield* s.claimMany({ deviceId: d.id, slots: Array.from({ length: REPOS }, (_, i) => i), now: t0, config: Config.defaults })
        for (const a of as) yield* s.submitResult({ deviceId: d.id, reservationId: a.reservationId, fence: a.fence, now: t0 + 1000, outcome: "clean", finalPhase: null, body: "{}" })
      })
    )
    for (let i = 0; i < REPOS; i++) fakes.github.put(`acme/r${i}`, Date.now() - 1000 - i)
    // Slow pages: unserialised cycles of several instances would overlap.
    fakes.github.delayMs = 700
    dir = mkdtempSync(join(tmpdir(), "scanfleet-three-"))
    const sources = join(dir, "sources.json")
    writeFileSync(sources, JSON.stringify({ github: { listings: [{ kind: "org", org: "acme" }], baseUrl: fakes.github.url }, intervalMinutes: 0.05, leaseSeconds: LEASE_MS / 1000, limits: { maxPages: 5, maxResults: 1000 } }))
    await prepare()
    const env = { SCANFLEET_DATABASE_URL: db.url, SCANFLEET_ADMIN_TOKEN: adminToken, SCANFLEET_LOG_LEVEL: "info", SCANFLEET_POOL_SIZE: "4", GITHUB_TOKEN: "" }
    servers = await Promise.all([0, 1, 2].map(() => serve(["--sources", sources], env, 180_000)))
  }, 240_000)
  afterAll(async () => {
    for (const s of servers) await s.stop("SIGKILL")
    await rt?.dispose()
    await fakes?.close()
    await db?.cleanup()
    if (dir) rmSync(dir, { recursive: true, force: true })
  })

  const cycles = async () =>
    (await query("SELECT id, started_at, ended_at, queued_updated_count FROM cycles WHERE source = 'github' ORDER BY started_at, id")).map((r) => ({
      id: Number(r.id),
      startedAt: Number(r.started_at),
      endedAt: Number(r.ended_at),
      updated: Number(r.queued_updated_count)
    }))
  const holder = async () => {
    const [r] = await query("SELECT holder, token, expires_at FROM leases WHERE name = 'discovery:github'")
    return r ? { holder: String(r.holder), token: Number(r.token), expiresAt: Number(r.expires_at) } : null
  }
  const serverOf = (h: string) => servers.find((s) => h.split(":").at(-2) === String(s.child.pid))

  // The cycles each process ran, from the `discovery_cycle` line it logs per cycle.
  const cyclesLogged = (p: ServerProcess) => p.output().split("\n").filter((l) => l.includes('"message":"discovery_cycle"')).length

  const expectSerialisedWithinBudget = (cs: Awaited<ReturnType<typeof cycles>>) => {
    for (const c of cs) expect(c.updated, `cycle ${c.id}`).toBeLessThanOrEqual(BUDGET)
    // One leader at a time: no two cycles of the source overlap, so the budget is spent by one cycle at a time.
    for (let i = 1; i < cs.length; i++) expect(cs[i].startedAt, `cycle ${cs[i].id} starts after cycle ${cs[i - 1].id} ended`).toBeGreaterThanOrEqual(cs[i - 1].endedAt)
  }

  it("one instance leads: cycles never overlap and a cycle's promotions never exceed the source's budget", async () => {
    const deadline = Date.now() + 60_000
    while ((await cycles()).length < 3 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200))
    const cs = await cycles()
    expect(cs.length).toBeGreaterThanOrEqual(3)
    expectSerialisedWithinBudget(cs)
    expect(cs.reduce((n, c) => n + c.updated, 0)).toBeGreaterThan(0)
    const h = await holder()
    expect(h).not.toBeNull()
    const leader = serverOf(h!.holder)!
    expect(leader).toBeDefined()
    // Every cycle so far ran in the leader; the other two ran none.
    expect(servers.map(cyclesLogged)).toEqual(servers.map((s) => (s === leader ? expect.any(Number) : 0)))
    expect(cyclesLogged(leader)).toBeGreaterThanOrEqual(cs.length)
  })

  it("killing the leader hands the lease over within one lease period (plus one poll), and discovery goes on under the new leader", async () => {
    const before = (await holder())!
    const leader = serverOf(before.holder)!
    const killedAt = Date.now()
    await leader.stop("SIGKILL")
    let after = await holder()
    while ((after === null || after.holder === before.holder) && Date.now() - killedAt < 4 * LEASE_MS) {
      await new Promise((r) => setTimeout(r, 25))
      after = await holder()
    }
    const handover = Date.now() - killedAt
    expect(after!.holder).not.toBe(before.holder)
    expect(after!.token).toBeGreaterThan(before.token)
    expect(serverOf(after!.holder)).not.toBe(leader)
    expect(handover, `handover took ${handover} ms`).toBeLessThanOrEqual(LEASE_MS + POLL_MS + 400)
    const count = (await cycles()).length
    const deadline = Date.now() + 30_000
    while ((await cycles()).length < count + 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200))
    const cs = await cycles()
    expect(cs.length).toBeGreaterThanOrEqual(count + 2)
    expectSerialisedWithinBudget(cs)
    // The survivor that did not take the lease ran no cycle at all.
    const next = serverOf(after!.holder)!
    for (const s of servers) if (s !== leader && s !== next) expect(cyclesLogged(s)).toBe(0)
    expect(cyclesLogged(next)).toBeGreaterThanOrEqual(2)
  })
})
