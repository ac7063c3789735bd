import { type Containment, ProcessTree, Scanner, Supervisor } from "@scanfleet/worker"
import { execa } from "execa"
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { afterEach, describe, expect, it, vi } from "vitest"
import { plan } from "./support/Contained.js"
import { cliPath, spawnCli } from "./support/Controller.js"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"
import { peek } from "./support/State.js"
import * as Unit from "./support/Unit.js"
import { useDeviceScratch } from "./support/Scratch.js"

useNoOrphans()

// Each test starts a server and controllers, and waits out a target-scan deadline or two.
vi.setConfig({ testTimeout: 180_000 })

// How a scan stage's end is settled when it is hard: a result staged once the kill began, a
// controller killed (kill -9) while its unit is being killed or cannot act and started again on
// the same state file, a work folder too big to remove quickly. Below pid-namespace a unit that
// has exited takes nothing with it, so the scanner's helpers keep a kill's grace running: the
// kill tests run at one of those levels.

const dir = useDeviceScratch("stage-end")

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

const until = <A>(what: string, f: () => Promise<A | undefined | null | false> | A | undefined | null | false, ms = 60_000): Promise<A> => Poll.until(what, f, ms, 25)

/** The pids the scanner's processes recorded. */
const recorded = (file: string): Array<number> => (existsSync(file) ? readFileSync(file, "utf8").trim().split("\n").filter(Boolean).map(Number) : [])

/** The strongest level below pid-namespace this machine allows (freeze-kill at least). */
const weaker = (["cgroup-v2", "cgroup-v1-freezer", "freeze-kill"] as const).find((l) => plan.available.includes(l))!
const cgroupV2 = plan.cgroupDirs["cgroup-v2"]

let n = 0
/** A scanner JSON file for `--scanner command:FILE`: an adversary run by node with a pid file. */
const scannerFile = (adversary: Parameters<typeof Unit.adversary>[0], pidFile: string): string => {
  const file = join(dir, `${adversary}-${++n}.json`)
  writeFileSync(file, JSON.stringify({ name: adversary, command: process.execPath, args: [Unit.adversary(adversary), pidFile], exitCodes: { "0": "clean" } }))
  return file
}

/**
 * Starts the CLI controller at `level`; with `cgroup`, the controller first moves itself into that
 * cgroup (v2), so its unit cgroups are made under it, where no controller of another test file
 * reclaims them.
 */
const controller = (fleet: Fleet.Fleet, state: string, scanner: string, level: Containment.Level, graceMs: number, cgroup?: string) => {
  const args = ["run", "--server", fleet.url, "--token", fleet.token, "--slots", "1", "--scanner", `command:${scanner}`, "--state", state, "--grace-ms", String(graceMs), "--poll-ms", "50"]
  const env = { SCANFLEET_CONTAINMENT: level }
  const p =
    cgroup === undefined
      ? spawnCli(args, env)
      : execa("sh", ["-c", `echo $$ > "${cgroup}/cgroup.procs" && exec "$0" "$@"`, process.execPath, cliPath, ...args], { reject: false, all: true, env: { ...process.env, ...env } })
  cleanups.push(async () => {
    if (p.exitCode === null && p.pid) p.kill("SIGKILL")
    await p
  })
  return p
}

const stageFiles = (state: string): Array<string> => (existsSync(`${state}.stage`) ? readdirSync(`${state}.stage`) : [])

describe(`a controller killed around its unit's end (containment ${weaker})`, () => {
  it("a controller killed during the deadline's grace, after its unit staged the clean exit its scanner made on SIGTERM, restarts into killed_at_deadline: a result staged at or after the deadline is no result", async () => {
    const fleet = await Fleet.start({ scanSeconds: 10, slots: 1 })
    cleanups.push(() => fleet.close())
    await fleet.seed(["acme/clean-on-term"])
    const state = join(dir, `grace-${++n}.db`)
    const pids = join(dir, `grace-${n}.pids`)
    const scanner = scannerFile("clean-on-term", pids)
    // A grace long enough to crash inside it on a loaded machine: the helper ignores SIGTERM, so it lasts.
    const first = controller(fleet, state, scanner, weaker, 20_000)
    const a = await until("the scanner and its helper to run", () =>
      peek(state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning" && x.runner && recorded(pids).length === 2))
    )
    // Past the deadline, the scanner got SIGTERM, exited 0, and the unit staged that exit.
    const staged = join(`${state}.stage`, `${a.fleetId}-r${a.reservationId}.json`)
    await until("the unit to stage after the deadline", () => existsSync(staged) && Date.now() > a.deadlines.scan, a.deadlines.scan - Date.now() + 30_000)
    const [scannerPid, helperPid] = recorded(pids)
    expect(ProcessTree.isAlive(scannerPid)).toBe(false)
    expect(ProcessTree.isAlive(helperPid), "the helper keeps the grace running").toBe(true)
    first.kill("SIGKILL")
    await first

    const second = controller(fleet, state, scanner, weaker, 20_000)
    const done = await fleet.settled(a.reservationId)
    expect(done).toMatchObject({ outcome: "killed_at_deadline", finalPhase: "scanning" })
    second.kill("SIGTERM")
    expect((await second).exitCode).toBe(0)
    expect(ProcessTree.isAlive(helperPid)).toBe(false)
    const journal = await peek(state, (s) => s.journal(a.reservationId))
    expect(journal.at(-1)?.phase).toBe("timed_out")
    expect(stageFiles(state)).toEqual([])
  })

  it("a result the unit stages once the kill began is not delivered and leaves no stage file behind, at the deadline and at a device stop", async () => {
    const fleet = await Fleet.start({ scanSeconds: 6, slots: 1 })
    const workRoot = mkdtempSync(join(dir, "stage-leak-"))
    const state = join(workRoot, "worker.db")
    const pids = join(workRoot, "scanner.pids")
    const events: Array<Supervisor.DeviceEvent> = []
    let device: Supervisor.Device | null = null
    try {
      await fleet.seed(["acme/stage-leak-deadline"])
      device = await Supervisor.start({
        server: fleet.url,
        token: fleet.token,
        slots: 1,
        scanner: Scanner.command({ name: "clean-on-term", command: process.execPath, args: [Unit.adversary("clean-on-term"), pids], exitCodes: { "0": "clean" } }),
        state,
        workRoot,
        containment: weaker,
        childPath: Unit.unitPath,
        graceMs: 1500,
        pollMs: 50,
        onEvent: (e) => void events.push(e)
      })
      const first = await until("the first result to be delivered", () => events.find((e) => e.type === "delivered"), 60_000)
      expect(await fleet.assignment(first.reservationId)).toMatchObject({ outcome: "killed_at_deadline", finalPhase: "scanning" })
      expect(stageFiles(state)).toEqual([])

      // A device stop: the scanner exits 0 on SIGTERM, the unit stages it, and the reservation is released all the same.
      rmSync(pids, { force: true })
      await fleet.seed(["acme/stage-leak-stop"])
      const second = await until("the second scanner and its helper to run", async () =>
        (await device!.state.assignments({ open: true })).find((a) => a.reservationId !== first.reservationId && a.phase === "scanning" && recorded(pids).length === 2)
      )
      await device.stop()
      device = null
      expect((await fleet.assignment(second.reservationId)).state).toBe("released")
      expect(stageFiles(state)).toEqual([])
    } finally {
      await device?.stop()
      await fleet.close()
    }
  })
})

// As root on Linux cgroup v2 is there (support/Contained checks every level is).
describe.skipIf(cgroupV2 === null)("a controller that crashed while its scanner had stopped the unit (containment cgroup-v2)", () => {
  it("the restart counts the processes it reclaimed from the unit's cgroup as the unit's survivors", async () => {
    const fleet = await Fleet.start({ scanSeconds: 30, slots: 1 })
    cleanups.push(() => fleet.close())
    await fleet.seed(["acme/stop-unit"])
    const state = join(dir, `stopped-${++n}.db`)
    const pids = join(dir, `stopped-${n}.pids`)
    const scanner = scannerFile("stop-unit", pids)
    // A cgroup of the test's own beside the test process's unit cgroups, emptied and removed after the test.
    const own = join(cgroupV2!, "..", `scanfleet-test-${process.pid}-${n}`)
    mkdirSync(own)
    cleanups.push(() =>
      until("the test's cgroup to be removed", () => [join(own, "scanfleet"), own].every((d) => {
        try {
          rmdirSync(d)
          return true
        } catch (e) {
          return (e as NodeJS.ErrnoException).code === "ENOENT"
        }
      }), 10_000)
    )
    const first = controller(fleet, state, scanner, "cgroup-v2", 300, own)
    const a = await until("the scanner to stop its unit", () =>
      peek(state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning" && x.runner && recorded(pids).length === 1 && ProcessTree.stat(x.runner.pid)?.state === "T"))
    )
    const unit = a.runner!.pid
    const [scannerPid] = recorded(pids)
    first.kill("SIGKILL")
    await first
    // A stopped unit cannot act on its controller's death: both wait for the next start.
    await new Promise((r) => setTimeout(r, 500))
    expect([unit, scannerPid].filter((p) => ProcessTree.isAlive(p))).toEqual([unit, scannerPid])

    const second = controller(fleet, state, scanner, "cgroup-v2", 300, own)
    const done = await fleet.settled(a.reservationId)
    expect(done).toMatchObject({ outcome: "scan_error", finalPhase: "scanning" })
    second.kill("SIGTERM")
    expect((await second).exitCode).toBe(0)
    expect([unit, scannerPid].filter((p) => ProcessTree.isAlive(p))).toEqual([])
    const recovered = (await peek(state, (s) => s.journal(a.reservationId))).filter((e) => e.kind === "recovered")
    expect(recovered).toHaveLength(1)
    expect(recovered[0].detail).toContain(`2 surviving process(es) of the unit (pid ${unit}) killed`)
  })
})

describe("the work folder of a scan stage", () => {
  it("a big work folder does not hold the slot: the slot is freed within grace + 1.5 s of the deadline while the folder is still there, and the folder is removed afterwards, off the controller's event loop", async () => {
    const fleet = await Fleet.start({ scanSeconds: 10, slots: 1 })
    const workRoot = mkdtempSync(join(dir, "many-files-"))
    const pids = join(dir, "many-files.pids")
    const events: Array<Supervisor.DeviceEvent> = []
    // The work folders in the work root (a folder being removed included).
    const folders = (): Array<string> => readdirSync(workRoot).filter((f) => f.startsWith("scanfleet-r"))
    let atFree: Array<string> = []
    let device: Supervisor.Device | null = null
    try {
      await fleet.seed(["acme/many-files"])
      device = await Supervisor.start({
        server: fleet.url,
        token: fleet.token,
        slots: 1,
        scanner: Scanner.command({ name: "many-files", command: process.execPath, args: [Unit.adversary("many-files"), pids], exitCodes: { "0": "clean" } }),
        state: join(workRoot, "worker.db"),
        workRoot,
        childPath: Unit.unitPath,
        graceMs: 300,
        pollMs: 50,
        onEvent: (e) => {
          if (e.type === "slot_freed") atFree = folders()
          events.push(e)
        }
      })
      const freed = await until("the slot to be freed", () => events.find((e): e is Extract<Supervisor.DeviceEvent, { type: "slot_freed" }> => e.type === "slot_freed"))
      expect(freed.end).toBe("deadline")
      expect(recorded(pids), "the scanner filled its folder until the deadline").toHaveLength(1)
      expect(atFree, "the folder was still there when the slot was freed").toHaveLength(1)
      expect(freed.at - freed.scanDeadline).toBeLessThan(300 + 1500)
      // The controller runs in this process: its event loop's longest wait, from the slot's freeing to the folder's end.
      let last = performance.now()
      let held = 0
      const lag = setInterval(() => {
        const now = performance.now()
        held = Math.max(held, now - last - 10)
        last = now
      }, 10)
      try {
        await until("the result to be delivered", () => events.find((e) => e.type === "delivered"))
        expect(await fleet.assignment(freed.reservationId)).toMatchObject({ outcome: "killed_at_deadline", finalPhase: "scanning" })
        await until("the work folder to be removed", () => folders().length === 0)
      } finally {
        clearInterval(lag)
      }
      // Removed by fs.promises.rm in this process, the folder held the loop for 0.7 to 3.4 s at a time.
      expect(held, "the longest the event loop was held while the folder was removed (ms)").toBeLessThan(250)
    } finally {
      await device?.stop()
      await fleet.close()
    }
  })

  it("a work folder whose controller died while removing it is removed when the next controller starts", async () => {
    const gone = execa("true")
    await gone
    const workRoot = mkdtempSync(join(dir, "swept-"))
    const left = join(workRoot, `scanfleet-r7-AbC123.removing-${gone.pid}`)
    mkdirSync(join(left, "d0"), { recursive: true })
    writeFileSync(join(left, "d0", "f0"), "")
    // Not a work folder of the device: left alone.
    const other = join(workRoot, "scanfleet-notes")
    mkdirSync(other)
    const fleet = await Fleet.start({ scanSeconds: 10, slots: 1 })
    const device = await Supervisor.start({ server: fleet.url, token: fleet.token, slots: 1, scanner: Scanner.demo(), state: join(workRoot, "worker.db"), workRoot, childPath: Unit.unitPath, pollMs: 50, onEvent: () => {} })
    try {
      await until("the half-removed folder to be gone", () => !existsSync(left))
      expect(existsSync(other)).toBe(true)
    } finally {
      await device.stop()
      await fleet.close()
    }
  })
})
