import { ProcessTree } from "@scanfleet/worker"
import { existsSync, readFileSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { afterEach, describe, expect, it, vi } from "vitest"
import { spawnCli } from "./support/Controller.js"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"
import { peek } from "./support/State.js"
import * as Unit from "./support/Unit.js"
import { useDeviceScratch } from "./support/Scratch.js"

useNoOrphans()

vi.setConfig({ testTimeout: 180_000 })

// The device's wall clock steps (as an NTP step or `date -s` would) while it runs: the controller runs
// under libfaketime, which fakes the wall clock from a file it rereads on every call and leaves the
// monotonic clock alone. Deadlines must hold on the device clock, which a wall-clock step cannot move.

const libfaketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
if (!existsSync(libfaketime)) throw new Error(`these tests need libfaketime at ${libfaketime} (Debian: apt-get install faketime)`)

const dir = useDeviceScratch("clock-step")

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

const until = <A>(what: string, f: () => Promise<A | undefined | null | false> | A | undefined | null | false, ms = 60_000): Promise<A> => Poll.until(what, f, ms, 25)

let n = 0
/** Starts the CLI controller with its wall clock offset by the seconds in `clockFile` ("+600", "-600"). */
const controller = (fleet: Fleet.Fleet, state: string, scanner: string, clockFile: string, graceMs: number) => {
  writeFileSync(clockFile, "+0")
  const p = spawnCli(
    ["run", "--server", fleet.url, "--token", fleet.token, "--slots", "1", "--scanner", `command:${scanner}`, "--state", state, "--grace-ms", String(graceMs), "--poll-ms", "50"],
    { LD_PRELOAD: libfaketime, FAKETIME_TIMESTAMP_FILE: clockFile, FAKETIME_NO_CACHE: "1", FAKETIME_DONT_FAKE_MONOTONIC: "1" }
  )
  cleanups.push(async () => {
    if (p.exitCode === null && p.pid) p.kill("SIGKILL")
    await p
  })
  return p
}

/** A scanner file for `--scanner command:FILE`: sleepy scans for `ms`, prints a finding and exits 3. */
const sleepy = (pidFile: string, ms: number, mode: "" | "ignore-term" = ""): string => {
  const file = join(dir, `sleepy-${++n}.json`)
  const args = [Unit.adversary("sleepy"), pidFile, String(ms), "{identity}", ...(mode ? [mode] : [])]
  writeFileSync(file, JSON.stringify({ name: "sleepy", command: process.execPath, args, exitCodes: { "0": "clean", "3": "findings" } }))
  return file
}

const pidOf = (file: string): number => (existsSync(file) ? Number(readFileSync(file, "utf8").trim().split("\n")[0]) : 0)

describe("deadlines on the device clock, which a wall-clock step cannot move", () => {
  it("a scan that ends in time is delivered with its findings when the device's wall clock steps 10 minutes forward mid-scan", async () => {
    const fleet = await Fleet.start({ scanSeconds: 20, uploadSeconds: 30, ttlSeconds: 60, slots: 1 })
    cleanups.push(() => fleet.close())
    await fleet.seed(["acme/jump"])
    const state = join(dir, `forward-${++n}.db`)
    const clock = join(dir, `forward-${n}.faketime`)
    const pids = join(dir, `forward-${n}.pids`)
    const p = controller(fleet, state, sleepy(pids, 5000), clock, 2000)
    const a = await until("the scanner to run", () => peek(state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning" && pidOf(pids) > 0)))
    await new Promise((r) => setTimeout(r, 1500))
    writeFileSync(clock, "+600")
    const done = await fleet.settled(a.reservationId)
    expect(done).toMatchObject({ outcome: "findings", finalPhase: "staging" })
    expect((await fleet.findings()).map((f) => f.detector)).toEqual(["sleepy"])
    const timeline = await fleet.timeline(a.reservationId)
    expect(timeline.map((e) => e.phase)).not.toContain("timed_out")
    p.kill("SIGTERM")
    expect((await p).exitCode).toBe(0)
  })

  it("a scanner ignoring SIGTERM is killed by deadline + grace + 1 s when the device's wall clock steps 10 minutes back during the grace", async () => {
    const fleet = await Fleet.start({ scanSeconds: 4, uploadSeconds: 30, ttlSeconds: 60, slots: 1 })
    cleanups.push(() => fleet.close())
    await fleet.seed(["acme/grace-trap"])
    const state = join(dir, `back-${++n}.db`)
    const clock = join(dir, `back-${n}.faketime`)
    const pids = join(dir, `back-${n}.pids`)
    const graceMs = 3000
    const p = controller(fleet, state, sleepy(pids, 3_600_000, "ignore-term"), clock, graceMs)
    const a = await until("the scanner to run", () => peek(state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning" && pidOf(pids) > 0)))
    const scanner = pidOf(pids)
    // The device clock read the wall clock (unstepped yet) when the controller started: the deadline is on the test's clock too.
    await until("the grace to begin", () => Date.now() >= a.deadlines.scan + 1000, a.deadlines.scan - Date.now() + 30_000)
    expect(ProcessTree.isAlive(scanner), "the scanner ignores SIGTERM").toBe(true)
    writeFileSync(clock, "-600")
    const bound = a.deadlines.scan + graceMs + 1000
    await until("the scanner to be killed", () => !ProcessTree.isAlive(scanner), bound - Date.now() + 20_000)
    expect(Date.now(), "killed by deadline + grace + 1 s").toBeLessThanOrEqual(bound)
    const done = await fleet.settled(a.reservationId)
    expect(done).toMatchObject({ outcome: "killed_at_deadline", finalPhase: "scanning" })
    p.kill("SIGTERM")
    expect((await p).exitCode).toBe(0)
  })
})
