import { existsSync, readFileSync, rmSync, utimesSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { describe, expect, it, vi } from "vitest"
import { useCleanups } from "./support/Cleanups.js"
import { runDevice } from "./support/Controller.js"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"
import { peek } from "./support/State.js"
import * as Stranded from "./support/Stranded.js"
import * as Unit from "./support/Unit.js"
import { useDeviceScratch } from "./support/Scratch.js"

useNoOrphans()

vi.setConfig({ testTimeout: 180_000 })

// A power cut right after a result was queued: the state file is written with synchronous = NORMAL,
// so the newest commits (the queued result among them) may never reach the disk, while the file
// system already holds what the unit staged. The device is killed (kill -9) while the server cannot
// be reached, and its WAL is cut back, frame by frame, until the queued result is gone, as a power
// cut leaves it. The restarted device must deliver the scan's own result.

const dir = useDeviceScratch("power-cut")

const defer = useCleanups()

/** Runs a scan to a queued result that cannot leave, kills the device, and cuts the power; `meanwhile` edits the files before the restart. */
const scanThroughPowerCut = async (identity: string, meanwhile: (stageFile: string) => void) => {
  const stranded = await Stranded.strand(dir, identity, defer)
  Stranded.powerCut(stranded.state)
  meanwhile(stranded.assignment.stageFile!)
  const r = await Stranded.deliver(stranded, defer)
  return { ...r, stageLeft: existsSync(stranded.assignment.stageFile!) }
}

describe("a power cut after a result was queued", () => {
  it("the staged result outlives its queueing until the receipt is in: a power cut that loses the queued result still delivers the scan's findings", async () => {
    const r = await scanThroughPowerCut("acme/power-cut", () => {})
    expect(r.done).toMatchObject({ outcome: "findings" })
    expect(r.findings.map((f) => f.detector)).toEqual(["sleepy"])
    expect(r.stageLeft, "the stage file is removed once the receipt is in").toBe(false)
  })

  it("a stage file an older build wrote (the bare result, staged at its mtime) is the scan's result after an upgrade", async () => {
    const r = await scanThroughPowerCut("acme/old-stage-file", (stageFile) => {
      const doc = JSON.parse(readFileSync(stageFile, "utf8")) as { stagedAt: number; staged: unknown }
      writeFileSync(stageFile, JSON.stringify(doc.staged))
      utimesSync(stageFile, doc.stagedAt / 1000, doc.stagedAt / 1000)
    })
    expect(r.done).toMatchObject({ outcome: "findings" })
    expect(r.findings.map((f) => f.detector)).toEqual(["sleepy"])
  })

  it("a power cut that loses a delivered result's receipt: the result sent again is answered with the original receipt, whose outcome the device records", async () => {
    const fleet = await Fleet.start({ scanSeconds: 20, uploadSeconds: 60, ttlSeconds: 120, slots: 1 })
    defer(() => fleet.close())
    await fleet.seed(["acme/lost-receipt"])
    const state = join(dir, "lost-receipt.db")
    const scanner = Unit.sleepyScanner(join(dir, "lost-receipt.json"), join(dir, "lost-receipt.pids"), 500)
    const first = runDevice(fleet, state, scanner, defer)
    expect(await fleet.settled(1)).toMatchObject({ outcome: "findings" })
    first.p.kill("SIGKILL")
    await first.p
    // Every commit from the queued result on is lost; the stage file, removed once the receipt was in, is gone.
    Stranded.powerCut(state)
    rmSync(join(`${state}.stage`, `${fleet.fleetId}-r1.json`), { force: true })

    const second = runDevice(fleet, state, scanner, defer)
    const done = await Poll.until("the assignment to end locally", () => peek(state, async (s) => ((await s.assignment(1))?.status === "done" ? s.assignment(1) : null)), 60_000)
    // It could only send a scan error (its result was lost); the server answered with the receipt of the findings.
    expect(done).toMatchObject({ outcome: "findings", receipt: { outcome: "findings" } })
    expect(done.note).toContain("with outcome findings; this device sent scan_error")
    expect((await fleet.assignment(1)).outcome).toBe("findings")
    second.p.kill("SIGTERM")
    expect((await second.p).exitCode).toBe(0)
  })
})
