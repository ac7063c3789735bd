import { Effect } from "effect"
import { spawn } from "node:child_process"
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Containment, ExecutionUnit, ProcessTree } from "@scanfleet/worker"
import { alive, plan, recorded } from "./support/Contained.js"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Unit from "./support/Unit.js"

/**
 * Containment beyond one unit's lifetime: cgroups a dead controller left, and
 * bounded memory under a stdout flood. The adversarial scanners under each
 * level are in Containment.<level>.test.ts (one file per level, so the levels
 * run in parallel); `plan` (imported from their shared module) checks that as
 * root every level is there.
 */
useNoOrphans()

const dir = mkdtempSync(join(tmpdir(), "scanfleet-contain-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))
beforeAll(() => Unit.build(), 120_000)

describe.each(["cgroup-v2", "cgroup-v1-freezer"] as const)("a unit cgroup left by a dead controller (%s)", (level) => {
  it("is emptied and removed when the next controller reclaims", async () => {
    const base = plan.cgroupDirs[level]
    expect(base).not.toBeNull()
    // A pid that belonged to a controller that is gone.
    const gone = spawn("true")
    await new Promise((r) => gone.once("exit", r))
    const cgroup = join(base!, `u${gone.pid}-deadbeef`)
    mkdirSync(cgroup, { recursive: true })
    const orphan = spawn("sleep", ["60"], { stdio: "ignore", detached: true })
    const exited = new Promise((r) => orphan.once("exit", r))
    writeFileSync(join(cgroup, "cgroup.procs"), String(orphan.pid))
    expect(ProcessTree.isAlive(orphan.pid!)).toBe(true)
    const reclaimPlan = Effect.runSync(Containment.withLevel(plan, level))
    // A controller starting in another test file at this moment may reclaim it first: what counts is
    // that the process is killed and the cgroup gone once this reclaim returns.
    await Effect.runPromise(Containment.reclaim(reclaimPlan))
    await exited
    expect(existsSync(cgroup)).toBe(false)
  })
})

/** VmHWM (peak resident set) of a process, KiB, from /proc. */
const peakKiB = (pid: number): number => Number(/VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0)

describe("bounded memory", () => {
  it.each(["json", "text", "oneline"])("a 200 MB stdout flood (%s) keeps the controller under 200 MiB and the unit under 256 MiB; the result says what was cut", async (mode) => {
    const pids = join(dir, `flood-${mode}.pids`)
    const work = mkdtempSync(join(dir, `flood-${mode}-`))
    // A controller process of its own, so its peak is the flood's and nothing else's.
    const controller = spawn(process.execPath, [Unit.adversary("flood-controller"), Unit.unitPath, work, Unit.adversary("flood"), pids, mode, String(200 * 1024 * 1024)], {
      stdio: ["pipe", "pipe", "inherit"]
    })
    const line = await new Promise<string>((resolve, reject) => {
      let out = ""
      controller.stdout.on("data", (d: Buffer) => {
        out += d.toString("utf8")
        if (out.includes("\n")) resolve(out.slice(0, out.indexOf("\n")))
      })
      controller.once("exit", (code) => reject(new Error(`the controller exited with ${code}`)))
    })
    const controllerMiB = peakKiB(controller.pid!) / 1024
    controller.stdin.end()
    await new Promise((r) => controller.once("exit", r))
    const end = JSON.parse(line) as ExecutionUnit.End
    expect(end.kind).toBe("staged")
    if (end.kind !== "staged") return
    const cut = end.staged.cut!
    expect(cut.stdoutBytes).toBe(200 * 1024 * 1024)
    expect(cut.unstoredBytes).toBe(200 * 1024 * 1024 - 64 * 1024 * 1024)
    if (mode === "json") {
      expect(end.staged.findings.length).toBeGreaterThan(0)
      expect(cut.findings).toBeGreaterThan(0)
      expect(end.staged.log).toContain("finding(s) cut at the limits")
    } else if (mode === "text") {
      expect(end.staged.findings).toEqual([])
      expect(end.staged.kind === "exit" && end.staged.malformed).toBeGreaterThan(1_000_000)
    } else expect(cut.longLines).toBe(1)
    expect(Buffer.byteLength(JSON.stringify(end.staged))).toBeLessThan(1_048_576)
    const unitMiB = (end.unitPeakRssKiB ?? Number.POSITIVE_INFINITY) / 1024
    console.log(`flood ${mode}: unit peak ${unitMiB.toFixed(0)} MiB, controller peak ${controllerMiB.toFixed(0)} MiB (VmHWM)`)
    expect(unitMiB).toBeLessThan(256)
    expect(controllerMiB).toBeLessThan(200)
    expect(alive(recorded(pids))).toEqual([])
  })
})
