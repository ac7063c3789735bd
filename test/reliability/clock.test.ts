import { SqliteStore } from "@scanfleet/adapters"
import { Config, Store } from "@scanfleet/core"
import { LocalState } from "@scanfleet/worker"
import { Effect, type Layer, ManagedRuntime } from "effect"
import fc from "fast-check"
import { mkdirSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, afterEach, beforeAll, describe, expect, inject, it, vi } from "vitest"
import { addDevice, applyConfig, storeOn } from "./support/Fleet.js"
import { adminToken, call, database, marked, type Proc, type ServerProc, startServer, startWorker, until } from "./support/Procs.js"
import * as Proxy from "./support/Proxy.js"

/**
 * Clocks that disagree. A device whose clock is far ahead of or behind the
 * server's (played by a proxy that shifts every instant the device is told)
 * still ends its scan stage at the real target-scan deadline, and the server
 * judges everything on its own clock whatever `at` the events carry. Two
 * server instances whose clocks differ by less than the handoff margin
 * (played at the Store level with different `now`s on one PostgreSQL
 * database) never accept a result after the other has expired the reservation.
 */

// Each test starts real processes; on a loaded machine that alone can take a minute.
vi.setConfig({ testTimeout: 180_000 })

const dir = mkdtempSync(join(tmpdir(), "scanfleet-clock-"))
const parkDir = join(dir, "release")
mkdirSync(parkDir)
const runner = fileURLToPath(new URL("./fixtures/parking-runner.mjs", import.meta.url))
let server: ServerProc
const procs: Array<Proc> = []
const proxies: Array<Proxy.Proxy> = []
const HOUR = 3_600_000

beforeAll(async () => {
  server = await startServer({ databaseUrl: `sqlite:${join(dir, "server.db")}`, logLevel: "warning", sweepIntervalMs: 100 })
  await applyConfig(server.url, { scan: 3, upload: 20, ttl: 30 })
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

const seed = async (identity: string) => {
  const rt = ManagedRuntime.make(SqliteStore.layer({ filename: join(dir, "server.db") }) as Layer.Layer<Store.Store, unknown>)
  try {
    await rt.runPromise(Effect.flatMap(Store.Store, (s) => s.recordObservations([{ source: "github", identity, remoteAt: null }], Date.now())))
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

/** Shifts every server instant in an answer by `ms`, as a server clock that far off would report it. */
const shift = (ms: number) => (_m: string, _p: string, text: string) => {
  try {
    const walk = (v: unknown, key = ""): unknown => {
      if (Array.isArray(v)) return v.map((x) => walk(x))
      if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, walk(x, k)]))
      if (typeof v === "number" && /^(at|serverNow|issuedAt|acceptedAt|assignmentExpiry|lastProgressAt|endedAt|expiredAt)$/.test(key)) return v + ms
      if (typeof v === "string" && key === "iso") return new Date(Date.parse(v) + ms).toISOString()
      return v
    }
    return JSON.stringify(walk(JSON.parse(text)))
  } catch {
    return text
  }
}

describe("clocks that disagree", () => {
  it.each([
    ["ahead of", -12 * HOUR],
    ["behind", 12 * HOUR]
  ] as const)("a device clock 12 hours %s the server's: the scan stage still ends at the real target-scan deadline and the server accepts the timeout on its own clock", async (_w, serverShift) => {
    const identity = `clock/park-scanning-${serverShift > 0 ? "behind" : "ahead"}-${Date.now()}`
    await seed(identity)
    const d = await addDevice(server.url, `skewed-${serverShift}`, 1)
    const proxy = await Proxy.start(server.url)
    proxies.push(proxy)
    proxy.rewrite = shift(serverShift)
    const state = join(dir, `skewed-${serverShift}.db`)
    const w = await startWorker({ server: proxy.url, token: d.token, state, scanner: `module:${runner}`, env: { SCANFLEET_PARK_DIR: parkDir } })
    procs.push(w)
    const a = await until("the claim", () => peek(state, async (s) => (await s.assignments({ limit: 1 }))[0]))
    // The device sees the server's instants shifted, and learns the offset from serverNow.
    expect(Math.abs(a.clockOffsetMs + serverShift)).toBeLessThan(5000)
    const done = await until(
      "the timeout at the server",
      async () => {
        const x = (await call(server.url, "GET", `/v1/admin/assignments/${a.reservationId}`, { token: adminToken })).body
        return x.assignment.state !== "active" ? x : null
      },
      20_000,
      100
    )
    const journal = await peek(state, (s) => s.journal(a.reservationId))
    const timedOut = journal.find((e) => e.phase === "timed_out")!
    const realDeadline = done.assignment.deadlines.targetScan.at
    // Real time, not the skewed one: the timeout lands at the server's deadline (within the watchdog's grace).
    expect(Math.abs(timedOut.at - realDeadline)).toBeLessThan(2500)
    expect(done.assignment.outcome).toBe("killed_at_deadline")
    // The server kept the device's `at` as sent and judged nothing by it: deadlines are as issued.
    expect(done.assignment.deadlines.resultUpload.at - done.assignment.issuedAt).toBe(23_000)
  })

  it("events stamped years ahead or behind change no deadline and renew nothing; the sweeper expires on the server's clock", async () => {
    await applyConfig(server.url, { scan: 1, upload: 1, ttl: 3, margin: 1 })
    await seed(`clock/raw-${Date.now()}`)
    const d = await addDevice(server.url, "raw-skew", 1)
    const c = await call(server.url, "POST", "/v1/assignments/claim", { token: d.token, body: { slot: 0 } })
    const a = c.body.assignment
    const events = [
      { seq: 1, kind: "phase", phase: "assigned", at: Date.now() + 10 * 365 * 24 * HOUR },
      { seq: 2, kind: "phase", phase: "permit_wait", at: 0 },
      { seq: 3, kind: "phase", phase: "scanning", at: 8_640_000_000_000 }
    ]
    const before = Date.now()
    const p = await call(server.url, "POST", `/v1/assignments/${a.reservationId}/progress`, { token: d.token, body: { fence: a.fence, events } })
    expect(p.status, p.text).toBe(200)
    expect(p.body.assignmentExpiry).toBe(a.deadlines.assignmentExpiry.at)
    const view = (await call(server.url, "GET", `/v1/assignments/${a.reservationId}`, { token: d.token })).body
    expect(view.deadlines).toEqual(a.deadlines)
    // Last progress is the server's time of acceptance, not the device's claim.
    expect(view.lastProgressAt).toBeGreaterThanOrEqual(before - 5)
    expect(view.lastProgressAt).toBeLessThanOrEqual(Date.now() + 5)
    const expired = await until("the expiry", async () => {
      const x = (await call(server.url, "GET", `/v1/admin/assignments/${a.reservationId}`, { token: adminToken })).body
      return x.assignment.state === "expired" ? x : null
    })
    expect(expired.assignment.expiry.expiredAt).toBeGreaterThanOrEqual(a.deadlines.assignmentExpiry.at)
    expect(expired.assignment.expiry.expiredAt - a.deadlines.assignmentExpiry.at).toBeLessThan(2000)
    await applyConfig(server.url, { scan: 3, upload: 20, ttl: 30 })
  })
})

describe("two server instances with clocks apart by less than the handoff margin (Store level, PostgreSQL)", () => {
  let db: Awaited<ReturnType<typeof database>>
  let store: ReturnType<typeof storeOn>
  beforeAll(async () => {
    db = await database(inject("pgUrl"))
    store = storeOn(db.url)
  }, 240_000)
  afterAll(async () => {
    await store?.close()
    await db?.drop()
  })

  const margin = 5
  const config: Config.ManagedConfig = {
    ...Config.defaults,
    assignments: { globalTtlSeconds: 10 + 10 + margin, handoffMarginSeconds: margin, overrides: { gitlab: { ttlSeconds: 7200 }, huggingface: { ttlSeconds: 7200 }, dockerhub: { ttlSeconds: 7200 } } },
    sources: { ...Config.defaults.sources, github: { ...Config.defaults.sources.github, scanTimeoutSeconds: 10, uploadTimeoutSeconds: 10 } }
  }

  it("a result and an expiry racing on instances whose clocks differ by less than the margin: the assignment ends exactly once, never with a result after its expiry, and a result in time is never lost to the other clock", async () => {
    let n = 0
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: -(margin * 1000 - 1), max: margin * 1000 - 1 }),
        fc.integer({ min: 15_000, max: 30_000 }),
        fc.boolean(),
        async (skew, realAt, resultFirst) => {
          const T0 = Date.UTC(2026, 0, 1) + ++n * 100_000
          const identity = `handoff/${n}`
          await store.run((s) => s.recordObservations([{ source: "github", identity, remoteAt: null }], T0))
          const dev = await store.run((s) => s.addDevice({ name: `i-${n}`, slots: 1, tokenHash: `h-${n}-${Math.random()}`, now: T0 }))
          const a = (await store.run((s) => s.claim({ deviceId: dev.id, slot: 0, now: T0, config })))!
          // Instance A (real clock) takes the upload; instance B (clock off by `skew`) sweeps at the same real instant.
          const upload = () =>
            store.run((s) => Effect.either(s.submitResult({ deviceId: dev.id, reservationId: a.reservationId, fence: a.fence, now: T0 + realAt, outcome: "clean", finalPhase: "staging", body: "{}" })))
          const sweep = () => store.run((s) => s.expireDue({ now: T0 + realAt + skew, maxAttempts: 3, limit: 1000 }))
          const [r, swept] = resultFirst ? await Promise.all([upload(), sweep()]) : await Promise.all([sweep(), upload()]).then(([x, y]) => [y, x] as const)
          const accepted = r._tag === "Right"
          const expiredIt = swept.some((x) => x.reservationId === a.reservationId)
          // A sweep skips a row another transaction holds; B's next sweep (same clock) picks it up.
          if (!accepted && !expiredIt) await sweep()
          const final = await store.run((s) => s.getAssignment(a.reservationId))
          // Exactly one ending, and the two never both.
          expect(accepted && expiredIt).toBe(false)
          expect(final.state).toBe(accepted ? "completed" : realAt + skew >= a.expiresAt - T0 ? "expired" : "active")
          // A result on time by its instance's clock is never refused because the other clock ran ahead.
          if (T0 + realAt <= a.uploadDeadline) expect(accepted, `result at +${realAt} ms, skew ${skew} ms`).toBe(true)
          if (accepted) expect(T0 + realAt).toBeLessThanOrEqual(a.uploadDeadline)
        }
      ),
      { numRuns: 40 }
    )
  })
})
