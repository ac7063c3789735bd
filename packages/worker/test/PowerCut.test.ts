import Sqlite from "better-sqlite3"
import { copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, truncateSync, utimesSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest"
import { bundle, spawnCli } from "./support/Controller.js"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"
import { peek } from "./support/State.js"
import * as Unit from "./support/Unit.js"

useNoOrphans()

vi.setConfig({ testTimeout: 180_000 })

// A power cut right after a result was queued: the state file is written with synchronous = NORMAL,
// so the newest commits (the queued result among them) may never reach the disk, while the file
// system already holds what the unit staged. The device is killed (kill -9) while the server cannot
// be reached, and its WAL is cut back, frame by frame, until the queued result is gone, as a power
// cut leaves it. The restarted device must deliver the scan's own result.

const dir = mkdtempSync(join(tmpdir(), "scanfleet-power-cut-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))
beforeAll(async () => {
  await Promise.all([bundle(), Unit.build()])
}, 120_000)

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

const until = <A>(what: string, f: () => Promise<A | undefined | null | false> | A | undefined | null | false, ms = 60_000): Promise<A> => Poll.until(what, f, ms, 25)

let n = 0
const controller = (url: string, token: string, state: string, scanner: string) => {
  const p = spawnCli(["run", "--server", url, "--token", token, "--slots", "1", "--scanner", `command:${scanner}`, "--state", state, "--poll-ms", "50", "--grace-ms", "300"])
  cleanups.push(async () => {
    if (p.exitCode === null && p.pid) p.kill("SIGKILL")
    await p
  })
  return p
}

/** Queued results in a state file whose WAL is cut to `bytes`, read from a copy. */
const queuedWith = (state: string, bytes: number): number => {
  const copy = join(dir, `copy-${++n}.db`)
  copyFileSync(state, copy)
  copyFileSync(`${state}-wal`, `${copy}-wal`)
  truncateSync(`${copy}-wal`, bytes)
  const db = new Sqlite(copy, { readonly: true })
  try {
    return (db.prepare("SELECT count(*) AS n FROM results").get() as { n: number }).n
  } finally {
    db.close()
    for (const f of [copy, `${copy}-wal`, `${copy}-shm`]) rmSync(f, { force: true })
  }
}

/** Drops whole frames from the end of the WAL of a stopped device until the queued result is gone, as a power cut does to unsynced commits. */
const powerCut = (state: string): void => {
  const wal = `${state}-wal`
  const pageSize = readFileSync(wal).readUInt32BE(8)
  const frame = 24 + pageSize
  const size = statSync(wal).size
  for (let cut = 1; 32 + cut * frame <= size; cut++) {
    if (queuedWith(state, size - cut * frame) > 0) continue
    truncateSync(wal, size - cut * frame)
    rmSync(`${state}-shm`, { force: true })
    return
  }
  throw new Error("the queued result is not in the WAL (checkpointed already?)")
}

/** A scanner file: sleepy scans for `ms`, prints one finding and exits 3. */
const sleepy = (pidFile: string, ms: number): string => {
  const file = join(dir, `sleepy-${++n}.json`)
  writeFileSync(file, JSON.stringify({ name: "sleepy", command: process.execPath, args: [Unit.adversary("sleepy"), pidFile, String(ms), "{identity}"], exitCodes: { "0": "clean", "3": "findings" } }))
  return file
}

/** Runs a scan to a queued result that cannot leave, kills the device, and cuts the power; `meanwhile` edits the files before the restart. */
const scanThroughPowerCut = async (identity: string, meanwhile: (stageFile: string) => void) => {
  const fleet = await Fleet.start({ scanSeconds: 20, uploadSeconds: 60, ttlSeconds: 120, slots: 1 })
  cleanups.push(() => fleet.close())
  const proxy = await Fleet.proxy(fleet.url)
  cleanups.push(() => proxy.close())
  await fleet.seed([identity])
  const state = join(dir, `cut-${++n}.db`)
  const scanner = sleepy(join(dir, `cut-${n}.pids`), 1500)
  const first = controller(proxy.url, fleet.token, state, scanner)
  const a = await until("the scan to start", () => peek(state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning")))
  await proxy.down()
  await until("the result to be queued", () => peek(state, (s) => s.result(a.reservationId)))
  first.kill("SIGKILL")
  await first
  powerCut(state)
  meanwhile(a.stageFile!)
  await proxy.up()
  const second = controller(proxy.url, fleet.token, state, scanner)
  const done = await fleet.settled(a.reservationId)
  second.kill("SIGTERM")
  expect((await second).exitCode).toBe(0)
  return { done, findings: await fleet.findings(), stageLeft: existsSync(a.stageFile!) }
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
})
