import { PhaseModel } from "@scanfleet/core"
import { ProcessTree } from "@scanfleet/worker"
import { execa } from "execa"
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest"
import { bundle, cliPath, spawnCli } from "./support/Controller.js"
import { plan } from "./support/Contained.js"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"
import { peek } from "./support/State.js"

useNoOrphans()

// Each test starts a server and controllers as processes, and waits for each up to a minute.
vi.setConfig({ testTimeout: 180_000 })

// These tests run the commands docs/worker.md and packages/worker/README.md show
// (`scanfleet-worker run`, `status`, `history`) as their own processes.

const dir = mkdtempSync(join(tmpdir(), "scanfleet-recovery-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))
beforeAll(async () => {
  await bundle()
}, 120_000)

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

const until = <A>(what: string, f: () => Promise<A | undefined | null | false>, ms = 60_000): Promise<A> => Poll.until(what, f, ms, 50)

/** Reads the state file the way `status` does, while a controller may be writing it. */
let n = 0
const controller = (fleet: Fleet.Fleet, state: string, scanner = "demo:slow") => {
  const p = spawnCli(["run", "--server", fleet.url, "--token", fleet.token, "--slots", "1", "--scanner", scanner, "--state", state, "--grace-ms", "300", "--poll-ms", "50"])
  cleanups.push(async () => {
    if (p.exitCode === null && p.pid) p.kill("SIGKILL")
    await p
  })
  return { p }
}

describe("crash recovery and shutdown of the worker process", () => {
  it("Process restarts during an assignment", async () => {
    // A target-scan deadline far enough away that the restart happens before it, even on a loaded machine.
    const fleet = await Fleet.start({ scanSeconds: 20 })
    cleanups.push(() => fleet.close())
    await fleet.seed(["acme/slow-repo"])
    const state = join(dir, `restart-${++n}.db`)

    const { p: first } = controller(fleet, state)
    const during = await until("the scanner to run", () =>
      peek(state, async (s) => {
        const [a] = await s.assignments({ open: true })
        return a && a.phase === "scanning" && a.runner ? { a, journal: await s.journal(a.reservationId) } : null
      })
    )
    const id = during.a.reservationId
    const pgid = during.a.runner!.pgid
    first.kill("SIGKILL")
    await first

    const { p: second } = controller(fleet, state)
    const receipt = await until("the result at the server", async () => {
      const a = await fleet.assignment(id)
      return a.outcome !== null ? a : null
    })
    expect(receipt.outcome).toBe("scan_error")
    expect(receipt.finalPhase).toBe("scanning")
    second.kill("SIGTERM")
    const exit = await second
    expect(exit.exitCode).toBe(0)

    // No process of the killed controller's runner group survived.
    expect(ProcessTree.members(pgid)).toEqual([])
    const journal = await peek(state, (s) => s.journal(id))
    // The earlier timeline is untouched, the sequence continues, and exactly one event records the recovery.
    expect(journal.slice(0, during.journal.length).map(({ delivery: _d, ackedAt: _a, error: _e, ...e }) => e)).toEqual(
      during.journal.map(({ delivery: _d, ackedAt: _a, error: _e, ...e }) => e)
    )
    expect(journal.map((e) => e.seq)).toEqual(journal.map((_, i) => i + 1))
    const recovered = journal.filter((e) => e.kind === "recovered")
    expect(recovered).toHaveLength(1)
    expect(recovered[0]).toMatchObject({ phase: "scanning" })
    expect(recovered[0].seq).toBeGreaterThan(during.journal.at(-1)!.seq)
    expect(journal.at(-1)?.phase).toBe("failed")
    // The server saw the same timeline, recovery included.
    const remote = await fleet.timeline(id)
    expect(remote.map((e) => [e.seq, e.kind, e.phase])).toEqual(journal.map((e) => [e.seq, e.kind, e.phase]))
  })

  it("a restart whose timeline has no room left for a recovery records none, and the reservation still ends with its result", async () => {
    const fleet = await Fleet.start({ scanSeconds: 30 })
    cleanups.push(() => fleet.close())
    await fleet.seed(["acme/slow-full"])
    const state = join(dir, `full-${++n}.db`)
    const { p: first } = controller(fleet, state)
    const a = await until("the scanner to run", () => peek(state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning" && x.runner)))
    first.kill("SIGKILL")
    await first
    // Earlier restarts, as many as the timeline takes: the journal reaches PhaseModel.lastRecoverySeq.
    await peek(state, async (s) => {
      for (let seq = a.lastSeq + 1; seq <= PhaseModel.lastRecoverySeq; seq++)
        await s.append(a.reservationId, { kind: "recovered", phase: "scanning", at: Date.now(), detail: `restart ${seq}` })
    })

    const { p: second } = controller(fleet, state)
    const done = await fleet.settled(a.reservationId)
    expect(done).toMatchObject({ outcome: "scan_error", finalPhase: "scanning" })
    second.kill("SIGTERM")
    expect((await second).exitCode).toBe(0)
    const journal = await peek(state, (s) => s.journal(a.reservationId))
    expect(journal.map((e) => e.seq)).toEqual(journal.map((_, i) => i + 1))
    expect(journal.filter((e) => e.kind === "recovered")).toHaveLength(PhaseModel.lastRecoverySeq - a.lastSeq)
    expect(journal.at(-1)).toMatchObject({ seq: PhaseModel.lastRecoverySeq + 1, phase: "failed" })
    expect((await fleet.timeline(a.reservationId)).map((e) => e.seq)).toEqual(journal.map((e) => e.seq))
  })

  it("a restart after the target-scan deadline passed uploads a timeout result naming the phase", async () => {
    // Room for the controller and its unit to start and reach scanning before the deadline on a loaded
    // machine (a CI run with 4 s saw the deadline pass first); the test waits the rest of it out.
    const fleet = await Fleet.start({ scanSeconds: 12 })
    cleanups.push(() => fleet.close())
    await fleet.seed(["acme/slow-late"])
    const state = join(dir, `late-${++n}.db`)
    const { p: first } = controller(fleet, state)
    const a = await until("the scanner to run", () => peek(state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning")))
    first.kill("SIGKILL")
    await first
    await new Promise((r) => setTimeout(r, Math.max(0, a.deadlines.scan - Date.now() + 100)))
    const { p: second } = controller(fleet, state)
    const done = await fleet.settled(a.reservationId)
    expect(done.outcome).toBe("killed_at_deadline")
    expect(done.finalPhase).toBe("scanning")
    second.kill("SIGTERM")
    await second
    const journal = await peek(state, (s) => s.journal(a.reservationId))
    expect(journal.filter((e) => e.kind === "recovered")).toHaveLength(1)
    expect(journal.at(-1)?.phase).toBe("timed_out")
  })

  it("recovery kills a runner group that outlived its controller, unless the pid now belongs to another process", async () => {
    const pidFile = join(dir, "orphan.pids")
    const orphan = execa(process.execPath, [fileURLToPath(new URL("./fixtures/stubborn-scanner.mjs", import.meta.url)), pidFile], { detached: true, reject: false })
    cleanups.push(() => orphan)
    const pgid = orphan.pid!
    await until("the group to form", async () => ProcessTree.members(pgid).length === 3)
    // A stale record whose leader start time does not match: a recycled pid is left alone.
    expect(await ProcessTree.killStale({ pgid, startTime: "1" })).toEqual([])
    expect(ProcessTree.members(pgid)).toHaveLength(3)
    const killed = await ProcessTree.killStale({ pgid, startTime: ProcessTree.startTime(pgid) })
    expect(killed).toHaveLength(3)
    expect(ProcessTree.members(pgid)).toEqual([])
  })

  it("a unit cgroup a dead controller left, with a process in it, is emptied and removed when the next controller starts", async () => {
    const base = plan.cgroupDirs["cgroup-v2"] ?? plan.cgroupDirs["cgroup-v1-freezer"]
    expect(base, "as root the unit cgroups have a place").not.toBeNull()
    // named as a unit cgroup of a controller whose pid is gone
    const gone = execa("true")
    await gone
    const cgroup = join(base!, `u${gone.pid}-0badcafe`)
    mkdirSync(cgroup, { recursive: true })
    const orphan = execa("sleep", ["60"], { detached: true, reject: false, stdio: "ignore" })
    cleanups.push(async () => {
      orphan.kill("SIGKILL")
      await orphan
    })
    writeFileSync(join(cgroup, "cgroup.procs"), String(orphan.pid))
    const fleet = await Fleet.start({ scanSeconds: 30 })
    cleanups.push(() => fleet.close())
    controller(fleet, join(dir, "reclaim.db"))
    await until("the orphan to be killed and its cgroup removed", async () => !ProcessTree.isAlive(orphan.pid!) && !existsSync(cgroup))
    expect((await orphan).signal).toBe("SIGKILL")
  })

  it("SIGTERM stops the device cleanly: the running unit's tree is killed, the reservation is released, status and history print the journal", async () => {
    const fleet = await Fleet.start({ scanSeconds: 30 })
    cleanups.push(() => fleet.close())
    await fleet.seed(["acme/slow-shutdown"])
    const state = join(dir, `shutdown-${++n}.db`)
    const { p } = controller(fleet, state)
    const a = await until("the scanner to run", () => peek(state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning" && x.runner)))
    const status = await execa(process.execPath, [await bundle(), "status", "--state", state], { reject: false })
    expect(status.stdout).toContain("current phase: scanning")
    expect(status.stdout).toMatch(/target-scan deadline .* in \d/)
    expect(status.stdout).toMatch(/result-upload deadline .* in \d/)
    expect(status.stdout).toMatch(/assignment expiry .* in \d/)
    p.kill("SIGTERM")
    const exit = await p
    expect(exit.exitCode).toBe(0)
    expect(ProcessTree.members(a.runner!.pgid)).toEqual([])
    // Nothing is known about the target, so it goes back to the queue.
    const remote = await fleet.assignment(a.reservationId)
    expect(remote.state).toBe("released")
    const history = await execa(process.execPath, [await bundle(), "history", "--state", state], { reject: false })
    expect(history.stdout).toContain("entered permit_wait")
    expect(history.stdout).toMatch(/#\s+\d+ \S+ entered failed\s+\[acked\]\s+the device shut down during scanning/)
    expect(history.stdout).toMatch(/release after #\d+ \[acked\]/)
  })

  it("status and history print wall-clock times, on a device whose clock was anchored before the wall clock was stepped an hour forward", async () => {
    const fleet = await Fleet.start({ scanSeconds: 30 })
    cleanups.push(() => fleet.close())
    await fleet.seed(["acme/slow-wall-clock"])
    const state = join(dir, `wall-clock-${++n}.db`)
    // This boot's anchor as a controller took it an hour before an NTP step set the wall clock right.
    const bootId = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim()
    writeFileSync(`${state}.clock`, JSON.stringify({ bootId, anchorMs: Date.now() - Number(process.hrtime.bigint()) / 1e6 - 3_600_000 }))
    const { p } = controller(fleet, state)
    const a = await until("the scanner to run", () => peek(state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning")))
    const [status, history] = await Promise.all(["status", "history"].map((c) => execa(process.execPath, [cliPath, c, "--state", state], { reject: false })))
    // The server's own times, on its wall clock: what a person compares the device's with.
    const expiresAt = (await fleet.assignment(a.reservationId)).expiresAt
    const assignedAt = (await fleet.timeline(a.reservationId))[0].acceptedAt
    const shownExpiry = Date.parse(/assignment expiry\s+(\S+)/.exec(status.stdout)![1])
    const shownAssigned = Date.parse(/#\s+1 (\S+) entered assigned/.exec(history.stdout)![1])
    expect(Math.abs(shownExpiry - expiresAt), status.stdout).toBeLessThan(5_000)
    expect(Math.abs(shownAssigned - assignedAt), history.stdout).toBeLessThan(5_000)
    expect(status.stdout).toMatch(/assignment expiry .* in \d/)
    p.kill("SIGTERM")
    expect((await p).exitCode).toBe(0)
  })
})
