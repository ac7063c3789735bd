import { SqliteStore } from "@scanfleet/adapters"
import { Store } from "@scanfleet/core"
import { LocalState, ProcessTree } from "@scanfleet/worker"
import { Effect, type Layer, ManagedRuntime } from "effect"
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest"
import { addDevice, applyConfig } from "./support/Fleet.js"
import { adminToken, call, marked, type Proc, type ServerProc, startServer, startWorker, until } from "./support/Procs.js"
import * as Proxy from "./support/Proxy.js"

/**
 * `kill -9` of a worker controller process at every phase an assignment can
 * be caught in, then a restart on the same state file. The server is a real
 * process on a SQLite file. After recovery: exactly one `recovered` event,
 * the journal before the crash untouched and its sequence unbroken, the
 * server's timeline identical to what the device sent, no process of the
 * dead controller's execution unit left, and the assignment ended at the
 * server with its evidence (outcome and final phase).
 */

// Each test starts real processes; on a loaded machine that alone can take a minute.
vi.setConfig({ testTimeout: 180_000 })

const dir = mkdtempSync(join(tmpdir(), "scanfleet-worker-crash-"))
const parkDir = join(dir, "release")
mkdirSync(parkDir)
const runner = fileURLToPath(new URL("./fixtures/parking-runner.mjs", import.meta.url))
const holdUnit = fileURLToPath(new URL("./fixtures/hold-unit.cjs", import.meta.url))
const freezeAfter = fileURLToPath(new URL("./fixtures/freeze-after-phase.cjs", import.meta.url))
let server: ServerProc
const procs: Array<Proc> = []

beforeAll(async () => {
  server = await startServer({ databaseUrl: `sqlite:${join(dir, "server.db")}`, logLevel: "warning", sweepIntervalMs: 200 })
  await applyConfig(server.url, { scan: 60, upload: 30, ttl: 120 })
}, 240_000)

afterEach(async () => {
  for (const p of procs.splice(0)) await p.kill("SIGKILL")
})

afterAll(async () => {
  await server?.kill("SIGTERM")
  rmSync(dir, { recursive: true, force: true })
  expect(marked()).toEqual([])
})

const peek = async <A>(file: string, f: (s: LocalState.LocalState) => Promise<A>): Promise<A> => {
  const s = await LocalState.open(file)
  try {
    return await f(s)
  } finally {
    await s.close()
  }
}

// Targets come in through the store the server uses: its SQLite file, opened from this process too.
const seed = async (identity: string) => {
  const rt = ManagedRuntime.make(SqliteStore.layer({ filename: join(dir, "server.db") }) as Layer.Layer<Store.Store, unknown>)
  try {
    await rt.runPromise(Effect.flatMap(Store.Store, (s) => s.recordObservations([{ source: "github", identity, remoteAt: null }], Date.now())))
  } finally {
    await rt.dispose()
  }
}

const strip = (e: LocalState.JournalEntry) => ({ seq: e.seq, kind: e.kind, phase: e.phase, at: e.at, detail: e.detail })

const phases = ["assigned", "permit_wait", "preparing", "acquiring", "scanning", "filtering", "cleanup", "staging", "bundling", "uploading", "awaiting_receipt"] as const
/** Phases the controller writes back to back: it is frozen right after committing one, then killed. */
const frozen: ReadonlyArray<string> = ["bundling", "uploading"]

describe("kill -9 of the worker controller at every phase", () => {
  it.each(phases)("killed during %s: one recovered event, nothing duplicated or reordered, no orphan, the assignment ends with evidence", async (phase) => {
    // Parked in cleanup, then released with the network down, the controller ends up awaiting its receipt.
    const identity = frozen.includes(phase) ? `crash/straight-${phase}-${Date.now()}` : `crash/park-${phase === "awaiting_receipt" ? "cleanup" : phase}-${Date.now()}`
    await seed(identity)
    const device = await addDevice(server.url, `crash-${phase}`, 1)
    const state = join(dir, `${phase}.db`)
    const proxy = await Proxy.start(server.url)
    const env = { SCANFLEET_PARK_DIR: parkDir }
    const scanner = `module:${runner}`
    // In "assigned" the unit is held before its first line; the restarted controller runs without the hold.
    const firstEnv =
      phase === "assigned"
        ? { ...env, NODE_OPTIONS: `--require ${holdUnit}`, SCANFLEET_HOLD_UNIT: join(parkDir, "never") }
        : frozen.includes(phase)
          ? { ...env, NODE_OPTIONS: `--require ${freezeAfter}`, SCANFLEET_FREEZE_AFTER_PHASE: phase }
          : env
    const first = await startWorker({ server: proxy.url, token: device.token, state, scanner, permits: phase === "permit_wait" ? 0 : 1, env: firstEnv })
    procs.push(first)
    const release = join(parkDir, identity.replace(/[^a-zA-Z0-9_-]/g, "_"))
    if (phase === "awaiting_receipt") {
      // The unit parks in cleanup; the network goes down; released, the controller stages, bundles and queues the result it cannot send.
      await until("cleanup", () => peek(state, async (s) => (await s.assignments({ open: true })).find((a) => a.phase === "cleanup")))
      await proxy.down()
      writeFileSync(release, "go")
    }
    const during = await until(`the controller to reach ${phase}`, () =>
      peek(state, async (s) => {
        const [a] = await s.assignments({ open: true })
        const unitGone = phase === "awaiting_receipt" || frozen.includes(phase)
        return a && a.phase === phase && (unitGone || a.runner) ? { a, journal: await s.journal(a.reservationId) } : null
      })
    )
    const id = during.a.reservationId
    const pgid = during.a.runner?.pgid ?? null
    first.child.kill("SIGKILL")
    await first.exited
    // The held unit cannot notice its controller died: it is an orphan until the restart's recovery.
    if (phase === "assigned") expect(ProcessTree.members(pgid!).length).toBeGreaterThan(0)
    await proxy.up()

    const second = await startWorker({ server: proxy.url, token: device.token, state, scanner, env })
    procs.push(second)
    const ended = await until(
      "the assignment to end at the server",
      async () => {
        const r = await call(server.url, "GET", `/v1/admin/assignments/${id}`, { token: adminToken })
        return r.body.assignment?.state !== "active" ? r.body : null
      },
      60_000,
      100
    )
    await until("the device to record the delivery", () => peek(state, async (s) => (await s.assignment(id))?.status === "done"))
    second.child.kill("SIGTERM")
    expect((await second.exited).code).toBe(0)
    await proxy.close()

    // No process of the killed controller's unit survived its recovery.
    if (pgid !== null) expect(ProcessTree.members(pgid)).toEqual([])
    expect(marked().filter((p) => p.pid !== server.pid)).toEqual([])

    const journal = await peek(state, (s) => s.journal(id))
    expect(journal.slice(0, during.journal.length).map(strip)).toEqual(during.journal.map(strip))
    expect(journal.map((e) => e.seq)).toEqual(journal.map((_, i) => i + 1))
    const recovered = journal.filter((e) => e.kind === "recovered")
    expect(recovered).toHaveLength(1)
    expect(recovered[0]).toMatchObject({ phase, seq: during.journal.length + 1 })

    // The server holds exactly the events the device sent: each once, in order.
    const sent = journal.filter((e) => e.delivery !== "local")
    expect(ended.timeline.map((e: { seq: number; kind: string; phase: string }) => [e.seq, e.kind, e.phase])).toEqual(sent.map((e) => [e.seq, e.kind, e.phase]))
    expect(journal.every((e) => e.delivery === "acked" || e.delivery === "local")).toBe(true)

    // The assignment ended with evidence: what ran last and how it ended.
    expect(["completed", "failed"]).toContain(ended.assignment.state)
    if (phase === "awaiting_receipt" || frozen.includes(phase)) {
      // The staged result survived the crash: the upload stage resumes and delivers it.
      expect(ended.assignment.outcome).toBe("clean")
      expect(ended.assignment.finalPhase).toBe("staging")
    } else {
      expect(ended.assignment.outcome).toBe("scan_error")
      expect(ended.assignment.finalPhase).toBe(phase)
      expect(journal.at(-1)?.phase).toBe("failed")
      expect(journal.at(-1)?.detail).toContain(`restarted during ${phase}`)
    }
  })
})
