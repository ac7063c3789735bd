import { SqliteStore } from "@scanfleet/adapters"
import { Store } from "@scanfleet/core"
import { LocalState } from "@scanfleet/worker"
import { Effect, type Layer, ManagedRuntime } from "effect"
import { mkdirSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest"
import { addDevice, applyConfig } from "./support/Fleet.js"
import { adminToken, call, marked, type Proc, type ServerProc, startServer, startWorker, until } from "./support/Procs.js"
import * as Proxy from "./support/Proxy.js"

/**
 * A worker process talks to a server process through a proxy on loopback
 * that plays the network: down for longer than the target-scan deadline,
 * down for longer than the assignment expiry, and up but losing the answers
 * to requests the server has already committed.
 */

// Each test starts real processes; on a loaded machine that alone can take a minute.
vi.setConfig({ testTimeout: 180_000 })

const dir = mkdtempSync(join(tmpdir(), "scanfleet-network-"))
const parkDir = join(dir, "release")
mkdirSync(parkDir)
const runner = fileURLToPath(new URL("./fixtures/parking-runner.mjs", import.meta.url))
let server: ServerProc
const procs: Array<Proc> = []
const proxies: Array<Proxy.Proxy> = []

beforeAll(async () => {
  server = await startServer({ databaseUrl: `sqlite:${join(dir, "server.db")}`, logLevel: "warning", sweepIntervalMs: 100 })
}, 240_000)

afterEach(async () => {
  for (const p of procs.splice(0)) await p.kill("SIGKILL")
  for (const p of proxies.splice(0)) await p.close()
})

afterAll(async () => {
  await server?.kill("SIGTERM")
  rmSync(dir, { recursive: true, force: true })
  expect(marked()).toEqual([])
})

const seed = async (identities: ReadonlyArray<string>) => {
  const rt = ManagedRuntime.make(SqliteStore.layer({ filename: join(dir, "server.db") }) as Layer.Layer<Store.Store, unknown>)
  try {
    await rt.runPromise(Effect.flatMap(Store.Store, (s) => s.recordObservations(identities.map((identity) => ({ source: "github" as const, identity, remoteAt: null })), Date.now())))
  } finally {
    await rt.dispose()
  }
}

const peek = async <A>(file: string, f: (s: LocalState.LocalState) => Promise<A>): Promise<A> => {
  const s = await LocalState.open(file)
  try {
    return await f(s)
  } finally {
    await s.close()
  }
}

const detail = async (id: number) => (await call(server.url, "GET", `/v1/admin/assignments/${id}`, { token: adminToken })).body

/** A device behind a fresh proxy, running the parking runner. */
const device = async (name: string) => {
  const d = await addDevice(server.url, name, 1)
  const proxy = await Proxy.start(server.url)
  proxies.push(proxy)
  const state = join(dir, `${name}.db`)
  const w = await startWorker({ server: proxy.url, token: d.token, state, scanner: `module:${runner}`, env: { SCANFLEET_PARK_DIR: parkDir } })
  procs.push(w)
  const claimed = () => until("a claim", () => peek(state, async (s) => (await s.assignments({ limit: 10 })).at(-1)))
  return { d, proxy, state, w, claimed }
}

describe("network faults between a worker and its server", () => {
  it("the server is unreachable for longer than the target-scan deadline: the deadline fires on time offline, and the timeout result and every event arrive once, in order, when the network returns", async () => {
    // The scan stage gets room for a sealed unit to start on a loaded machine and still be seen scanning.
    await applyConfig(server.url, { scan: 8, upload: 20, ttl: 35 })
    await seed([`net/park-scanning-${Date.now()}`])
    const t = await device("offline-scan")
    const a = await until("scanning", () => peek(t.state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning")))
    await t.proxy.down()
    // Offline past the target-scan deadline: the unit is killed at it regardless.
    await until("the timeout, offline", () => peek(t.state, async (s) => (await s.journal(a.reservationId)).find((e) => e.phase === "timed_out")), 15_000)
    const local = await peek(t.state, (s) => s.journal(a.reservationId))
    const timedOut = local.find((e) => e.phase === "timed_out")!
    expect(timedOut.at - a.deadlines.scan).toBeLessThan(2500)
    await new Promise((r) => setTimeout(r, Math.max(0, a.deadlines.scan + 2000 - Date.now())))
    expect((await detail(a.reservationId)).assignment.state).toBe("active")
    await t.proxy.up()
    const done = await until("the result at the server", async () => {
      const x = await detail(a.reservationId)
      return x.assignment.state !== "active" ? x : null
    })
    expect(done.assignment.outcome).toBe("killed_at_deadline")
    expect(done.assignment.finalPhase).toBe("scanning")
    const journal = await peek(t.state, (s) => s.journal(a.reservationId))
    expect(done.timeline.map((e: { seq: number; phase: string; at: number }) => [e.seq, e.phase, e.at])).toEqual(journal.filter((e) => e.delivery !== "local").map((e) => [e.seq, e.phase, e.at]))
  })

  it("the server is unreachable for longer than the assignment expiry: the server expires the reservation with evidence, nothing late is accepted, and the device goes back to work when the network returns", async () => {
    // One attempt: the expired target fails rather than coming back to park the next claim.
    await applyConfig(server.url, { scan: 6, upload: 3, ttl: 10, margin: 1, maxAttempts: 1 })
    const stamp = Date.now()
    await seed([`net/park-scanning-${stamp}`, `net/quick-${stamp}`])
    const t = await device("offline-expiry")
    const a = await until("scanning", () => peek(t.state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning")))
    await until("the server to hear of scanning", async () => (await detail(a.reservationId)).assignment.lastPhase === "scanning")
    await t.proxy.down()
    const expired = await until(
      "the server to expire the reservation",
      async () => {
        const x = await detail(a.reservationId)
        return x.assignment.state === "expired" ? x : null
      },
      20_000,
      100
    )
    // The evidence: the last phase and progress time the server had when the expiry passed.
    expect(expired.assignment.expiry).toMatchObject({ lastPhase: "scanning" })
    expect(expired.assignment.expiry.expiredAt).toBeGreaterThanOrEqual(expired.assignment.deadlines.assignmentExpiry.at)
    await new Promise((r) => setTimeout(r, 1000))
    await t.proxy.up()
    // The next target is claimed and completed once the network is back.
    const next = await until(
      "the next assignment to complete",
      async () => {
        const list = await call(server.url, "GET", "/v1/admin/assignments?limit=50", { token: adminToken })
        return list.body.assignments.find((x: { target: { identity: string }; state: string }) => x.target.identity === `net/quick-${stamp}` && x.state === "completed")
      },
      20_000,
      100
    )
    expect(next.outcome).toBe("clean")
    const after = await detail(a.reservationId)
    // Nothing the device held back was accepted after the expiry.
    expect(after.assignment.state).toBe("expired")
    expect(after.assignment.outcome).toBeNull()
    expect(after.timeline.every((e: { acceptedAt: number }) => e.acceptedAt <= after.assignment.expiry.expiredAt)).toBe(true)
    const local = await peek(t.state, async (s) => ({ a: await s.assignment(a.reservationId), r: await s.result(a.reservationId), j: await s.journal(a.reservationId) }))
    expect(local.r?.delivery === "abandoned" || local.r?.delivery === "refused").toBe(true)
    expect(local.a?.receipt).toBeNull()
    expect(t.w.output()).not.toContain(t.d.token)
    expect(t.w.output()).toContain("retry")
  })

  it("a claim's answer lost after the server committed it: the retry is refused slot_busy naming the reservation, and the worker releases it and claims again at once instead of idling the slot until the expiry", async () => {
    // An expiry of 15 minutes: a slot left to wait for it would idle past the test.
    await applyConfig(server.url, { scan: 30, upload: 30, ttl: 900 })
    await seed([`net/lost-claim-${Date.now()}`])
    const d = await addDevice(server.url, "lost-claim", 1)
    const proxy = await Proxy.start(server.url)
    proxies.push(proxy)
    proxy.dropAfterCommit((m, p) => m === "POST" && p === "/v1/assignments/claim", 1)
    const state = join(dir, "lost-claim.db")
    const w = await startWorker({ server: proxy.url, token: d.token, state, scanner: `module:${runner}`, env: { SCANFLEET_PARK_DIR: parkDir } })
    procs.push(w)
    const rec = await until("a receipt", () => peek(state, async (s) => (await s.assignments({ limit: 5 })).find((x) => x.receipt !== null)), 30_000).catch((e) => {
      throw new Error(`${(e as Error).message}\nproxy: ${JSON.stringify(proxy.log)}\nworker: ${w.output().slice(-3000)}`)
    })
    // The first claim was committed and answered 200, but the device never heard; its retry was refused, the
    // reservation released, and the next claim took a target.
    const calls = proxy.log.filter((l) => l.path.startsWith("/v1/assignments/claim") || l.path.endsWith("/release"))
    expect(calls.slice(0, 4).map((l) => [l.path.replace(/assignments\/\d+/, "assignments/N"), l.status, l.dropped])).toEqual([
      ["/v1/assignments/claim", 200, true],
      ["/v1/assignments/claim", 409, false],
      ["/v1/assignments/N/release", 200, false],
      ["/v1/assignments/claim", 200, false]
    ])
    const released = (await call(server.url, "GET", "/v1/admin/assignments?state=released&limit=1000", { token: adminToken })).body.assignments.filter(
      (a: { deviceId: number }) => a.deviceId === d.id
    )
    expect(released).toHaveLength(1)
    const lost = released[0].reservationId as number
    expect(lost).toBeLessThan(rec.reservationId)
    expect(calls[2].path).toBe(`/v1/assignments/${lost}/release`)
    // The device never ran it: its local state has no record of it, and the server heard of it only why it was released.
    expect(await peek(state, (s) => s.assignment(lost))).toBeNull()
    const timeline = (await detail(lost)).timeline as Array<{ seq: number; phase: string; detail?: string }>
    expect(timeline.map((e) => [e.seq, e.phase])).toEqual([
      [1, "assigned"],
      [2, "failed"]
    ])
    expect(timeline[1].detail).toContain("released by its device, whose local state has no record of it: the answer to this slot's claim was lost after the server had taken it")
    const line = w
      .output()
      .split("\n")
      .find((l) => l.includes('"message":"released"'))
    expect(line).toContain("the answer to this slot's claim was lost after the server had taken it")
    expect(w.output()).not.toContain("is busy at the server")
  })

  it("answers lost after the server committed (progress and result): the worker retries and gets the original acceptance and receipt; nothing is stored twice", async () => {
    await applyConfig(server.url, { scan: 30, upload: 30, ttl: 90 })
    await seed([`net/lossy-${Date.now()}`])
    const d = await addDevice(server.url, "lossy", 1)
    const proxy = await Proxy.start(server.url)
    proxies.push(proxy)
    proxy.dropAfterCommit((m, p) => m === "POST" && p.endsWith("/progress"), 2)
    proxy.dropAfterCommit((m, p) => m === "POST" && p.endsWith("/result"), 2)
    const state = join(dir, "lossy.db")
    const w = await startWorker({ server: proxy.url, token: d.token, state, scanner: `module:${runner}`, env: { SCANFLEET_PARK_DIR: parkDir } })
    procs.push(w)
    const rec = await until("the receipt", () => peek(state, async (s) => (await s.assignments({ limit: 5 })).find((x) => x.receipt !== null)), 30_000).catch(async (e) => {
      throw new Error(`${(e as Error).message}\nproxy: ${JSON.stringify(proxy.log)}\nworker: ${w.output().slice(-3000)}\nstate: ${JSON.stringify(await peek(state, async (s) => [await s.assignments({ limit: 5 }), await s.outboxReservations()]))}`)
    })
    const results = proxy.log.filter((l) => l.path.endsWith("/result"))
    // The first two uploads were committed and answered 200, but the device never heard; the third got through.
    expect(results.slice(0, 3).map((l) => [l.status, l.dropped])).toEqual([[200, true], [200, true], [200, false]])
    expect(proxy.log.filter((l) => l.path.endsWith("/progress") && l.dropped).length).toBe(2)
    // The receipt the device keeps is the one the server issued for the first upload.
    const again = await call(server.url, "POST", `/v1/assignments/${rec.reservationId}/result`, { token: d.token, body: (await peek(state, (s) => s.result(rec.reservationId)))!.body })
    expect(again.status).toBe(200)
    expect(again.body.receiptId).toBe(rec.receipt!.receiptId)
    const x = await detail(rec.reservationId)
    const journal = await peek(state, (s) => s.journal(rec.reservationId))
    expect(x.timeline.map((e: { seq: number }) => e.seq)).toEqual(journal.filter((e) => e.delivery !== "local").map((e) => e.seq))
    expect(x.assignment.state).toBe("completed")
    // The device's own logs (retries included) never show its token.
    expect(w.output()).not.toContain(d.token)
  })
})
