import { readdirSync, rmSync } from "node:fs"
import { basename, dirname, join } from "node:path"
import { describe, expect, it, vi } from "vitest"
import { useCleanups } from "./support/Cleanups.js"
import { runDevice } from "./support/Controller.js"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"
import { peek } from "./support/State.js"
import * as Unit from "./support/Unit.js"
import { useDeviceScratch } from "./support/Scratch.js"

useNoOrphans()

vi.setConfig({ testTimeout: 180_000 })

// A device whose local state is gone (deleted, or replaced by an empty file) while the server still
// holds one of its reservations.

const dir = useDeviceScratch("lost-state")

const defer = useCleanups()

let n = 0
const controller = (fleet: Fleet.Fleet, state: string, scanner: string) => runDevice(fleet, state, scanner, defer)

/** Every file of a state: the SQLite file and everything beside it named after it. */
const removeState = (state: string) => {
  for (const f of readdirSync(dirname(state))) if (f.startsWith(basename(state))) rmSync(join(dirname(state), f), { recursive: true, force: true })
}

describe("a device that lost its local state", () => {
  it("a slot the server holds for a reservation the device no longer knows is released at the slot's first claim, said once with why, and the slot claims again long before the expiry", async () => {
    // An expiry of 10 minutes: a slot left to wait for it would idle past the test.
    const fleet = await Fleet.start({ scanSeconds: 60, uploadSeconds: 30, ttlSeconds: 600, slots: 1 })
    defer(() => fleet.close())
    await fleet.seed(["acme/held"])
    const state = join(dir, `lost-${++n}.db`)
    const scanner = Unit.sleepyScanner(join(dir, `sleepy-${n}.json`), join(dir, `lost-${n}.pids`), 600_000)
    const first = controller(fleet, state, scanner)
    await Poll.until("the scan to start", () => peek(state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning")), 60_000, 25)
    first.p.kill("SIGKILL")
    await first.p
    const held = await fleet.assignment(1)
    removeState(state)
    await fleet.seed(["acme/waiting"])

    const second = controller(fleet, state, scanner)
    const released = () => second.out().split("\n").filter((l) => l.includes('"message":"released"'))
    await Poll.until("the release in the log", () => released().length > 0, 30_000, 50)
    expect(released()[0]).toContain('"level":"warning"')
    expect(released()[0]).toMatch(/"reservationId":1\b/)
    expect(released()[0]).toContain("its local state has no record of it: was the state file replaced or deleted?")
    // Released at the server with what it had heard and one event more, the device's reason: the device ran none of it.
    const ended = await fleet.assignment(1)
    expect(ended.state).toBe("released")
    expect(ended.lastSeq).toBe(held.lastSeq + 1)
    expect((await fleet.timeline(1)).at(-1)).toMatchObject({
      seq: held.lastSeq + 1,
      phase: "failed",
      detail: expect.stringContaining("released by its device, whose local state has no record of it: was the state file replaced or deleted?")
    })
    // The slot claims again at once: the released target (first in the queue again) is claimed anew.
    const claimedAnew = () => second.out().split("\n").some((l) => l.includes('"message":"claimed"') && Number(/"reservationId":(\d+)/.exec(l)?.[1]) > 1)
    await Poll.until("slot 0 to claim again", claimedAnew, 30_000, 50)
    expect(released()).toHaveLength(1)
    expect(second.out()).not.toContain("is busy at the server")
    second.p.kill("SIGTERM")
    expect((await second.p).exitCode).toBe(0)
  })

  it("a state file deleted under a running controller stops it with an error naming the file and a non-zero exit, before it claims again", async () => {
    const fleet = await Fleet.start({ scanSeconds: 20, slots: 1 })
    defer(() => fleet.close())
    const state = join(dir, `deleted-${++n}.db`)
    const device = controller(fleet, state, "demo")
    await Poll.until("the device to poll for work", () => device.out().includes("worker started"), 60_000, 25)
    removeState(state)
    await fleet.seed(["acme/after-the-loss"])
    const exit = await Promise.race([device.p, new Promise<null>((r) => setTimeout(() => r(null), 30_000))])
    expect(exit, "the controller stopped").not.toBeNull()
    expect(exit!.exitCode).not.toBe(0)
    expect(device.out()).toContain(`${state} was deleted or replaced while the controller ran`)
    expect((await fleet.assignment(1).catch(() => null))?.state ?? "never claimed").toBe("never claimed")
  })
})
