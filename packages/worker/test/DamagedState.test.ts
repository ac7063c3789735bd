import Sqlite from "better-sqlite3"
import { execa } from "execa"
import { randomBytes } from "node:crypto"
import { closeSync, existsSync, openSync, readdirSync, readFileSync, rmSync, statSync, truncateSync, writeSync, writeFileSync } from "node:fs"
import { basename, dirname, join } from "node:path"
import { describe, expect, it, vi } from "vitest"
import { useCleanups } from "./support/Cleanups.js"
import { cliPath, runDevice, type RunningDevice } from "./support/Controller.js"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"
import { peek } from "./support/State.js"
import * as Stranded from "./support/Stranded.js"
import { useDeviceScratch } from "./support/Scratch.js"

useNoOrphans()

vi.setConfig({ testTimeout: 180_000 })

// A device whose files are damaged on disk while it is down (a cut write, a disk fault, an overwrite):
// the SQLite state file, its lock database, the device clock's anchor file, the stage folder and a stage
// file. Each is set aside beside itself, said once in the log, and the device goes back to work, where
// before it stopped with SQLite's raw error at every start (or silently dropped what it could not read).
// What docs/worker.md ("Damaged local state") tells an operator to look at, `status` and the files set
// aside, is what these tests read.

const dir = useDeviceScratch("damaged-state")

const defer = useCleanups()

let n = 0

/** The files set aside beside `file` (named `<file>.damaged-<ISO time>`). */
const asideOf = (file: string) =>
  readdirSync(dirname(file))
    .filter((f) => f.startsWith(`${basename(file)}.damaged-`) && !/-(wal|shm)$/.test(f))
    .map((f) => join(dirname(file), f))

/** The device's log lines at `level` that mention `text`. */
const logged = (device: RunningDevice, level: string, text: string) =>
  device
    .out()
    .split("\n")
    .filter((l) => l.includes(`"level":"${level}"`) && l.includes(text))

/** The outcomes of a demo scan that ran (which one depends on the identity). */
const scanned = /^(clean|findings)$/

const status = (state: string) => execa(process.execPath, [cliPath, "status", "--state", state], { reject: false })

describe("a state file damaged while the device was down", () => {
  // Damage as a disk or a cut write leaves it, to the file a crash left (its WAL checkpointed into it first,
  // so the damage is the file's own), with the code SQLite answers it with.
  const damages: ReadonlyArray<readonly [string, string, (file: string) => void]> = [
    ["truncated mid-page", "SQLITE_CORRUPT", (f) => truncateSync(f, 1500)],
    ["zeroed", "SQLITE_NOTADB", (f) => writeFileSync(f, Buffer.alloc(statSync(f).size))],
    ["overwritten with garbage", "SQLITE_NOTADB", (f) => writeFileSync(f, randomBytes(statSync(f).size))],
    ["truncated to nothing", "truncated", (f) => truncateSync(f, 0)]
  ]

  it.each(damages)(
    "a state file %s is set aside and the device starts afresh, saying what was lost; the reservation it held is not run again: the device releases it and its slot claims again",
    async (_, code, damage) => {
      // The held target's scan outlasts the test (demo:held sleeps an hour on it); its reservation would expire 10 minutes after the claim.
      const fleet = await Fleet.start({ scanSeconds: 6, uploadSeconds: 5, ttlSeconds: 600, slots: 2 })
      defer(() => fleet.close())
      await fleet.seed(["acme/held"])
      const state = join(dir, `whole-${++n}.db`)
      const first = runDevice(fleet, state, "demo:held", defer, { slots: 2 })
      await Poll.until("the held scan to start", () => peek(state, async (s) => (await s.assignments({ open: true })).find((a) => a.phase === "scanning")), 60_000)
      first.p.kill("SIGKILL")
      await first.p
      const held = await fleet.assignment(1)
      const db = new Sqlite(state)
      db.pragma("wal_checkpoint(TRUNCATE)")
      db.close()
      damage(state)
      const damaged = readFileSync(state)

      await fleet.seed(["acme/after"])
      const second = runDevice(fleet, state, "demo:held", defer, { slots: 2 })
      await Poll.until("the reset in the log", () => logged(second, "error", `the state file ${state} was damaged`).length > 0, 30_000)
      const [line] = logged(second, "error", `the state file ${state} was damaged`)
      expect(line).toContain(`(${code}`)
      expect(line).toContain("started afresh")
      expect(line).toMatch(/Lost with it: .*released when (its slot|their slots) next claim/)
      // Set aside, byte for byte, never deleted.
      const [aside] = asideOf(state)
      expect(readFileSync(aside).equals(damaged), "the set-aside file holds the damaged bytes").toBe(true)
      expect(line).toContain(`set aside as ${aside}`)

      // The other slot works: the new target is scanned and delivered.
      expect((await fleet.settled(await fleet.reservationOf("acme/after"))).outcome).toMatch(scanned)
      // The server names the lost reservation when its slot claims; the device releases it, said once with the reset's reason.
      await Poll.until("the release in the log", () => logged(second, "warning", '"message":"released"').length > 0, 30_000)
      expect(logged(second, "warning", '"message":"released"')[0]).toContain(`its damaged predecessor set aside as ${aside}`)
      // The held reservation ran on at no point: the server heard nothing more of it than the device's reason for the release.
      const released = await fleet.assignment(1)
      expect(released.state).toBe("released")
      expect(released.lastSeq).toBe(held.lastSeq + 1)
      expect((await fleet.timeline(1)).at(-1)?.detail).toContain(`released by its device, whose local state has no record of it: the state file was started afresh`)
      expect(await peek(state, (s) => s.assignment(1))).toBeNull()
      // ... and its slot claims again, long before the reservation's expiry.
      await fleet.seed(["acme/later"])
      await Poll.until("slot 0 to claim again", () => second.out().split("\n").some((l) => l.includes('"message":"claimed"') && l.includes('"slot":0')), 30_000)
      expect(logged(second, "warning", '"message":"released"')).toHaveLength(1)
      expect(second.out()).not.toContain("is busy at the server")
      expect(logged(second, "error", `the state file ${state} was damaged`)).toHaveLength(1)

      const shown = await status(state)
      expect(shown.exitCode).toBe(0)
      expect(shown.stdout).toContain(`the previous one was damaged (${code}`)
      expect(shown.stdout).toContain(`is kept as ${aside}`)
      second.p.kill("SIGTERM")
      expect((await second.p).exitCode).toBe(0)
    }
  )

  it("status and history refuse a damaged state file with the reason, and leave it for the device to set aside", async () => {
    const state = join(dir, `read-only-${++n}.db`)
    writeFileSync(state, randomBytes(8192))
    for (const command of ["status", "history"]) {
      const r = await execa(process.execPath, [cliPath, command, "--state", state], { reject: false })
      expect(r.exitCode).toBe(1)
      expect(r.stderr).toContain(`the state file ${state} is damaged (SQLITE_NOTADB: file is not a database)`)
      expect(r.stderr).toContain("the next 'scanfleet-worker run' on it sets it aside")
    }
    expect(asideOf(state)).toEqual([])
  })
})

describe("a state file damaged while the device runs", () => {
  it("stops the controller at SQLite's first answer that the file is damaged, said once with its code, with a non-zero exit; the next start sets the file aside, releases what the server still held, and scans", async () => {
    // The held target's scan outlasts the test (demo:held sleeps an hour on it); its reservation would expire 10 minutes after the claim.
    const fleet = await Fleet.start({ scanSeconds: 6, uploadSeconds: 5, ttlSeconds: 600, slots: 2 })
    defer(() => fleet.close())
    await fleet.seed(["acme/held"])
    const state = join(dir, `running-${++n}.db`)
    const first = runDevice(fleet, state, "demo:held", defer, { slots: 2 })
    await Poll.until("the held scan to start", () => peek(state, async (s) => (await s.assignments({ open: true })).find((a) => a.phase === "scanning")), 60_000)
    // A disk fault under the open file: the pages of the assignments and events tables overwritten with garbage in
    // the database file, once the device's log (WAL) holds no newer copy of them. Then a write through SQLite to
    // the file's header, so the device's connection drops its cached pages at its next read and reads the garbage.
    const db = new Sqlite(state)
    await Poll.until("a checkpoint with the device idle", () => ((db.pragma("wal_checkpoint(TRUNCATE)") as Array<{ busy: number }>)[0].busy === 0 ? true : null), 10_000, 50)
    const pageSize = db.pragma("page_size", { simple: true }) as number
    const roots = db.prepare("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name IN ('assignments', 'events')").pluck().all() as Array<number>
    const fd = openSync(state, "r+")
    for (const page of roots) writeSync(fd, randomBytes(pageSize), 0, pageSize, (page - 1) * pageSize)
    closeSync(fd)
    db.pragma("user_version = 7")
    db.close()
    // The next claim is the device's next state write.
    await fleet.seed(["acme/next"])
    const exit = await Promise.race([first.p, new Promise<null>((r) => setTimeout(() => r(null), 30_000))])
    expect(exit, "the controller stopped").not.toBeNull()
    expect(exit!.exitCode).not.toBe(0)
    const said = logged(first, "error", "while the controller ran")
    expect(said).toHaveLength(1)
    expect(said[0]).toContain(`the state file is damaged (SQLITE_CORRUPT`)
    expect(said[0]).toContain("the next start sets it aside")

    const second = runDevice(fleet, state, "demo:held", defer, { slots: 2 })
    await Poll.until("the reset in the log", () => logged(second, "error", `the state file ${state} was damaged`).length > 0, 30_000)
    expect(asideOf(state)).toHaveLength(1)
    // Every reservation the first run held ends (released at its stop, or when the server names it to the second run).
    const held = [await fleet.reservationOf("acme/held"), await fleet.reservationOf("acme/next")]
    await Poll.until("the first run's reservations to end", async () => {
      const views = await Promise.all(held.map((id) => fleet.assignment(id)))
      return views.every((v) => v.state !== "active") ? views : null
    }, 30_000, 100)
    await fleet.seed(["acme/after"])
    expect((await fleet.settled(await fleet.reservationOf("acme/after"))).outcome).toMatch(scanned)
    second.p.kill("SIGTERM")
    expect((await second.p).exitCode).toBe(0)
  })
})

describe("files beside the state file damaged while the device was down", () => {
  const damages: ReadonlyArray<readonly [string, (state: string) => string, string]> = [
    ["the lock database overwritten with garbage", (state) => (writeFileSync(`${state}.lock.db`, randomBytes(5000)), `${state}.lock.db`), "the lock database"],
    ["the clock anchor file overwritten with garbage", (state) => (writeFileSync(`${state}.clock`, randomBytes(300)), `${state}.clock`), "the device clock's anchor file"],
    ["the clock anchor file cut short", (state) => (writeFileSync(`${state}.clock`, readFileSync(`${state}.clock`).subarray(0, 20)), `${state}.clock`), "the device clock's anchor file"],
    ["the stage folder replaced by a file", (state) => (rmSync(`${state}.stage`, { recursive: true }), writeFileSync(`${state}.stage`, "x"), `${state}.stage`), "the stage folder"]
  ]

  it.each(damages)("%s is set aside, said once, and the device scans", async (_, damage, what) => {
    const fleet = await Fleet.start({ scanSeconds: 20, slots: 1 })
    defer(() => fleet.close())
    const state = join(dir, `beside-${++n}.db`)
    const first = runDevice(fleet, state, "demo", defer)
    await Poll.until("the device to start", () => first.out().includes("worker started"), 60_000)
    first.p.kill("SIGTERM")
    await first.p
    const file = damage(state)
    const damaged = readFileSync(file)

    await fleet.seed(["acme/beside"])
    const second = runDevice(fleet, state, "demo", defer)
    expect((await fleet.settled(1)).outcome).toMatch(scanned)
    const lines = logged(second, "error", `${what} ${file} was`)
    expect(lines).toHaveLength(1)
    const [aside] = asideOf(file)
    expect(lines[0]).toContain(`set aside as ${aside}`)
    expect(readFileSync(aside).equals(damaged), "the set-aside file holds the damaged bytes").toBe(true)
    second.p.kill("SIGTERM")
    expect((await second.p).exitCode).toBe(0)
  })

  it("a stage file overwritten while its result waited to be delivered is set aside and said, without a word of what it held, and the reservation still ends", async () => {
    const stranded = await Stranded.strand(dir, "acme/stage-file", defer)
    // The queued result is lost to a power cut, so the restart needs the stage file, which is damaged.
    Stranded.powerCut(stranded.state)
    const stageFile = stranded.assignment.stageFile!
    const kept = readFileSync(stageFile, "utf8")
    const damaged = kept.slice(0, Math.floor(kept.length / 2))
    writeFileSync(stageFile, damaged)

    const r = await Stranded.deliver(stranded, defer)
    expect(r.done).toMatchObject({ outcome: "scan_error", finalPhase: "awaiting_receipt" })
    const lines = r.out.split("\n").filter((l) => l.includes('"level":"error"') && l.includes(`the stage file ${stageFile}`))
    expect(lines).toHaveLength(1)
    expect(lines[0]).toContain(`reservation ${stranded.assignment.reservationId}`)
    expect(lines[0]).toContain("not JSON")
    // What the scanner found (not redacted yet in a stage file) is not in the log.
    expect(r.out).not.toContain("f-acme_stage-file")
    const [aside] = asideOf(stageFile)
    expect(lines[0]).toContain(`set aside as ${aside}`)
    expect(readFileSync(aside, "utf8")).toBe(damaged)
    expect(existsSync(stageFile)).toBe(false)
    const journal = await peek(stranded.state, (s) => s.journal(stranded.assignment.reservationId))
    expect(journal.at(-1)).toMatchObject({ phase: "failed" })
    expect(journal.at(-1)?.detail).toContain(`its staged result was damaged (not JSON`)
  })
})
