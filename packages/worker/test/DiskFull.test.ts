import { execaSync } from "execa"
import { closeSync, mkdirSync, openSync, rmSync, writeFileSync, writeSync } from "node:fs"
import { join } from "node:path"
import { afterEach, describe, expect, it, vi } from "vitest"
import { spawnCli } from "./support/Controller.js"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"
import * as Unit from "./support/Unit.js"
import { useDeviceScratch } from "./support/Scratch.js"

useNoOrphans()

vi.setConfig({ testTimeout: 180_000 })

// The device's state on a small tmpfs that fills up to the last byte while a scan runs, then gets room
// again. Mounting one takes root: without it this file fails, loudly, rather than skip.

if (process.getuid?.() !== 0) throw new Error("DiskFull.test.ts mounts a tmpfs and needs root")

const dir = useDeviceScratch("disk-full")

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

/** Writes zeros into `file` until the file system has no byte left. */
const fill = (file: string) => {
  const fd = openSync(file, "w")
  const block = Buffer.alloc(4096)
  try {
    for (;;) writeSync(fd, block)
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOSPC") throw e
  } finally {
    closeSync(fd)
  }
}

describe("a state disk that fills up", () => {
  it("a reservation whose state writes failed on a full disk is finished once there is room again, not left to expire at the server", async () => {
    const mnt = join(dir, "mnt")
    mkdirSync(mnt)
    execaSync("mount", ["-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt])
    cleanups.push(async () => execaSync("umount", [mnt]))
    // Expiry far beyond the test: a reservation left to the server would still be open at its end.
    const fleet = await Fleet.start({ scanSeconds: 30, uploadSeconds: 60, ttlSeconds: 600, slots: 1 })
    cleanups.push(() => fleet.close())
    await fleet.seed(["acme/full"])
    const state = join(mnt, "worker.db")
    const scanner = join(dir, "sleepy.json")
    writeFileSync(scanner, JSON.stringify({ name: "sleepy", command: process.execPath, args: [Unit.adversary("sleepy"), join(dir, "pids"), "2000", "{identity}"], exitCodes: { "3": "findings" } }))
    const p = spawnCli(["run", "--server", fleet.url, "--token", fleet.token, "--slots", "1", "--scanner", `command:${scanner}`, "--state", state, "--poll-ms", "50", "--grace-ms", "300"])
    let out = ""
    p.all?.on("data", (d: Buffer) => (out += d.toString("utf8")))
    cleanups.push(async () => {
      if (p.exitCode === null && p.pid) p.kill("SIGKILL")
      await p
    })
    await Poll.until("the scan to start", () => fleet.timeline(1).then((t) => t.some((e) => e.phase === "scanning")), 60_000, 50)
    const filler = join(mnt, "filler")
    fill(filler)
    await Poll.until("a state write to fail", () => out.includes("slot 0, reservation 1:"), 30_000, 50)
    await new Promise((r) => setTimeout(r, 1500))
    rmSync(filler)
    const done = await fleet.settled(1, 30_000)
    expect(done.outcome).not.toBeNull()
    expect(out).toContain("state disk full: slot 0, reservation 1:")
    expect(out).toContain("database or disk is full")
    p.kill("SIGTERM")
    expect((await p).exitCode).toBe(0)
  })
})
