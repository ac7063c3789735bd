import { rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { afterEach, describe, expect, it, vi } from "vitest"
import { execa } from "execa"
import { cliPath } from "./support/Controller.js"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"
import { useDeviceScratch } from "./support/Scratch.js"

useNoOrphans()

vi.setConfig({ testTimeout: 180_000 })

// One controller per state file: a second one's recovery would kill the first one's live scans.
// The starters share one CPU (taskset), so the scheduler interleaves them inside their lock taking.

const dir = useDeviceScratch("single")

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

const STARTERS = 6
const ROUNDS = 4
let n = 0

describe("the single-controller lock", () => {
  it.each([
    ["no lock file", null],
    ["an empty (torn) lock file", ""],
    ["a stale lock file naming a dead process", JSON.stringify({ pid: 999_999_999, startTime: "1" })]
  ])("of many controllers started at once on one state file over %s, exactly one runs and the others name it", async (_, content) => {
    const fleet = await Fleet.start({ scanSeconds: 20, slots: 1 })
    cleanups.push(() => fleet.close())
    const state = join(dir, `race-${++n}.db`)
    for (let round = 0; round < ROUNDS; round++) {
      if (content === null) rmSync(`${state}.lock`, { force: true })
      else writeFileSync(`${state}.lock`, content)
      const ps = Array.from({ length: STARTERS }, () =>
        execa("taskset", ["-c", "0", process.execPath, cliPath, "run", "--server", fleet.url, "--token", fleet.token, "--slots", "1", "--scanner", "demo", "--state", state, "--poll-ms", "50"], {
          reject: false,
          all: true
        })
      )
      cleanups.push(async () => {
        for (const p of ps) if (p.exitCode === null && p.pid) p.kill("SIGKILL")
        await Promise.all(ps)
      })
      // Refused starters exit within seconds; two winners would both run on (the count below says so).
      await Poll.until("all but one to exit", () => ps.filter((p) => p.exitCode !== null).length >= STARTERS - 1, 30_000, 50).catch(() => null)
      // A second winner would be running by now as well.
      await new Promise((r) => setTimeout(r, 1500))
      const running = ps.filter((p) => p.exitCode === null)
      expect(running.length, `round ${round}: controllers running`).toBe(1)
      const winner = running[0]!
      for (const p of ps.filter((q) => q !== winner)) {
        const out = await p
        expect(out.exitCode).not.toBe(0)
        expect(out.all).toContain(`in use by a running controller (pid ${winner.pid})`)
      }
      winner.kill("SIGTERM")
      expect((await winner).exitCode).toBe(0)
    }
  })
})
