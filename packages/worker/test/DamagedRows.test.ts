import Sqlite from "better-sqlite3"
import { execa } from "execa"
import { join } from "node:path"
import { describe, expect, it, vi } from "vitest"
import { useCleanups } from "./support/Cleanups.js"
import { cliPath, runDevice } from "./support/Controller.js"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"
import { peek } from "./support/State.js"
import * as Stranded from "./support/Stranded.js"
import { useDeviceScratch } from "./support/Scratch.js"
import { sleepyScanner } from "./support/Unit.js"

useNoOrphans()

vi.setConfig({ testTimeout: 180_000 })

// Single rows of a device's state file whose payload is not what it should be (a bit flipped on disk, a
// hand edit), written with better-sqlite3 behind the device's back. Each row is set aside alone, its
// table and key said (never its payload: a row may hold a secret), and everything else goes on. Before,
// any one of them stopped the device at every start, or `status` and `history` with it.

const dir = useDeviceScratch("damaged-rows")

const defer = useCleanups()

/** Runs `f` on the state file with better-sqlite3, as something other than the device would. */
const edit = <A>(state: string, f: (db: Sqlite.Database) => A): A => {
  const db = new Sqlite(state)
  try {
    return f(db)
  } finally {
    db.close()
  }
}

const cli = (command: string, state: string) => execa(process.execPath, [cliPath, command, "--state", state], { reject: false })

describe("damaged rows in a device's state file", () => {
  it("a damaged queued result, two damaged journal entries (one the server already had), a damaged slot and an unreadable assignment are each set aside alone: the scan's own result is delivered with its timeline whole", async () => {
    const stranded = await Stranded.strand(dir, "acme/damaged-rows", defer)
    const { fleetId, reservationId: id } = stranded.assignment
    // The newest event the server heard, as a lost answer leaves it: accepted there, still to be sent here.
    const had = (await stranded.fleet.timeline(id)).map((e) => e.seq)
    const atServer = had.at(-1)!
    // Each payload carries a marker that must never reach a log line.
    const last = edit(stranded.state, (db) => {
      const seqs = (db.prepare("SELECT seq FROM events WHERE reservation_id = ? ORDER BY seq").all(id) as Array<{ seq: number }>).map((e) => e.seq)
      db.prepare("UPDATE results SET body = ? WHERE reservation_id = ?").run('{"fence":1,"outcome":"findings","findings":[{"secret":"SECRET-RESULT', id)
      db.prepare("UPDATE events SET delivery = 'pending', acked_at = NULL WHERE reservation_id = ? AND seq >= ?").run(id, atServer)
      // the one the server already had, and the last one
      db.prepare("UPDATE events SET phase = 'SECRET-EVENT' WHERE reservation_id = ? AND seq IN (?, ?)").run(id, atServer, seqs.at(-1))
      db.prepare("UPDATE slots SET doc = 'SECRET-SLOT' WHERE slot = 0").run()
      db.prepare("INSERT INTO assignments (fleet_id, reservation_id, doc, status) VALUES (?, 999, ?, 'running')").run(fleetId, '{"view":{"token":"SECRET-ASSIGNMENT"')
      return seqs.at(-1)!
    })
    expect(last, "the last entry was journaled after the network went down").toBeGreaterThan(atServer)
    const pending = [atServer, last]

    const r = await Stranded.deliver(stranded, defer)
    // The queued result was set aside: the restart queued the scan's own result again from its stage file.
    expect(r.done).toMatchObject({ outcome: "findings" })
    expect(r.findings.map((f) => f.detector)).toEqual(["sleepy"])
    // The server's timeline is whole, to the last entry: every sequence once, a stand-in where a damaged entry was
    // that it never had. Where it had the original, it keeps it, and the device's stand-in settles as delivered.
    const timeline = await stranded.fleet.timeline(id)
    expect(timeline.map((e) => e.seq), JSON.stringify({ had, last, timeline })).toEqual(timeline.map((_, i) => i + 1))
    // (and, after the last entry, the restart's own recovered event)
    expect(timeline.length, JSON.stringify({ had, last, timeline })).toBeGreaterThan(last)
    expect(timeline.find((e) => e.seq === last)?.detail).toContain(`this device's record of event ${last} was damaged and set aside`)
    expect(timeline.find((e) => e.seq === last)?.phase, "the last entry's phase is the one its record kept").toBe("awaiting_receipt")
    expect(timeline.find((e) => e.seq === atServer)?.detail ?? "").not.toContain("was damaged")
    const standIn = (await peek(stranded.state, (s) => s.journal({ fleetId, reservationId: id }))).find((e) => e.seq === atServer)!
    expect(standIn.delivery).toBe("acked")
    expect(standIn.detail).toContain(`this device's record of event ${atServer} was damaged`)

    const errors = r.out.split("\n").filter((l) => l.includes('"level":"error"'))
    const said = (table: string, key: string) => errors.filter((l) => l.includes(`the state file ${stranded.state}: a row of its ${table} table (${key}) was damaged`))
    expect(said("results", `fleet ${fleetId}, reservation ${id}`)).toHaveLength(1)
    for (const seq of pending) expect(said("events", `fleet ${fleetId}, reservation ${id}, sequence ${seq}`)).toHaveLength(1)
    expect(said("slots", "slot 0")).toHaveLength(1)
    expect(said("assignments", `fleet ${fleetId}, reservation 999`)[0]).toContain("it is released when its slot next claims and the server names it (slot_busy)")
    expect(r.out).not.toContain("SECRET")
    // Kept, as they were, for a person to look at.
    const kept = edit(stranded.state, (db) => db.prepare("SELECT table_name, row FROM damaged_rows ORDER BY n").all() as Array<{ table_name: string; row: string }>)
    expect(kept.map((k) => k.table_name).sort()).toEqual(["assignments", "events", "events", "results", "slots"])
    expect(kept.every((k) => k.row.includes("SECRET"))).toBe(true)
    const status = await cli("status", stranded.state)
    expect(status.exitCode).toBe(0)
    expect(status.stdout).toContain("rows set aside as damaged: 5")
    expect(status.stdout).toContain(`assignments (fleet ${fleetId}, reservation 999): not JSON`)
    expect(status.stdout).not.toContain("SECRET")
  })

  it("a queued result damaged while the device runs is set aside when the outbox reads it and queued again from its stage file at once: the scan's own result is delivered without a restart", async () => {
    const fleet = await Fleet.start({ scanSeconds: 20, uploadSeconds: 60, ttlSeconds: 120, slots: 1 })
    defer(() => fleet.close())
    const proxy = await Fleet.proxy(fleet.url)
    defer(() => proxy.close())
    await fleet.seed(["acme/damaged-while-running"])
    const state = join(dir, "damaged-while-running.db")
    const scanner = sleepyScanner(join(dir, "damaged-while-running.json"), join(dir, "damaged-while-running.pids"), 1500)
    const device = runDevice({ url: proxy.url, token: fleet.token }, state, scanner, defer)
    const scanning = await Poll.until("the scan to start", () => peek(state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning")), 60_000)
    await Poll.until("the server to hear the first events", async () => ((await fleet.timeline(scanning.reservationId)).length >= 2 ? true : null), 30_000)
    await proxy.down()
    await Poll.until("the result to be queued", () => peek(state, (s) => s.result(scanning.reservationId)), 60_000)
    // Cut short under the running device, its payload carrying a marker that must never reach a log line.
    edit(state, (db) => db.prepare("UPDATE results SET body = ? WHERE reservation_id = ?").run('{"fence":1,"outcome":"findings","findings":[{"secret":"SECRET-RESULT', scanning.reservationId))
    await proxy.up()

    const done = await fleet.settled(scanning.reservationId, 30_000)
    expect(done).toMatchObject({ outcome: "findings" })
    expect((await fleet.findings()).map((f) => f.detector)).toEqual(["sleepy"])
    expect(device.p.exitCode, "the device did not restart").toBeNull()
    const said = device.out().split("\n").filter((l) => l.includes(`a row of its results table (fleet ${scanning.fleetId}, reservation ${scanning.reservationId}) was damaged`))
    expect(said).toHaveLength(1)
    // The server's timeline says why the result came again: one recovered event, after the events it had.
    const recovered = (await fleet.timeline(scanning.reservationId)).filter((e) => e.kind === "recovered")
    expect(recovered).toHaveLength(1)
    expect(recovered[0].detail).toContain("its queued result was damaged and set aside during awaiting_receipt")
    expect(device.out()).not.toContain("SECRET")
    device.p.kill("SIGTERM")
    expect((await device.p).exitCode).toBe(0)
  })

  it("status and history set aside a damaged controller record and a damaged finished assignment, and show the rest", async () => {
    const stranded = await Stranded.strand(dir, "acme/damaged-history", defer)
    const r = await Stranded.deliver(stranded, defer)
    expect(r.done).toMatchObject({ outcome: "findings" })
    const { fleetId, reservationId: id } = stranded.assignment
    edit(stranded.state, (db) => {
      db.prepare("UPDATE meta SET value = 'SECRET-CONTROLLER' WHERE key = 'controller'").run()
      // A second finished assignment, beside the damaged one, that history still shows.
      const doc = (db.prepare("SELECT doc FROM assignments WHERE reservation_id = ?").get(id) as { doc: string }).doc
      db.prepare("INSERT INTO assignments (fleet_id, reservation_id, doc, status) VALUES (?, ?, ?, 'done')").run(fleetId, id + 1, doc.replace(`"reservationId":${id}`, `"reservationId":${id + 1}`))
      db.prepare("UPDATE assignments SET doc = json_set(doc, '$.fence', 'SECRET-FENCE') WHERE reservation_id = ?").run(id)
    })
    const status = await cli("status", stranded.state)
    expect(status.exitCode).toBe(0)
    expect(status.stdout).toContain("meta (controller): not JSON")
    expect(status.stdout).toContain("containment: ")
    const history = await cli("history", stranded.state)
    expect(history.exitCode).toBe(0)
    expect(history.stdout).toContain(`reservation ${id + 1} github:acme/damaged-history`)
    expect(history.stdout).not.toContain(`reservation ${id} github:`)
    const again = await cli("status", stranded.state)
    expect(again.stdout).toContain("rows set aside as damaged: 2")
    expect(again.stdout).toContain(`assignments (fleet ${fleetId}, reservation ${id}): fence: invalid_type`)
    expect(`${status.stdout}${status.stderr}${history.stdout}${history.stderr}${again.stdout}`).not.toContain("SECRET")
  })

  it("the damaged record of a reservation the device holds: set aside alone; the server names the reservation when its slot claims and the device releases it (said once, naming the record), while the other slot scans", async () => {
    // The held target's scan outlasts the test (demo:held sleeps an hour on it); its reservation would expire 10 minutes after the claim.
    const fleet = await Fleet.start({ scanSeconds: 6, uploadSeconds: 5, ttlSeconds: 600, slots: 2 })
    defer(() => fleet.close())
    await fleet.seed(["acme/held-record"])
    const state = join(dir, "held-record.db")
    const first = runDevice(fleet, state, "demo:held", defer, { slots: 2 })
    const held = await Poll.until("the held scan to start", () => peek(state, async (s) => (await s.assignments({ open: true })).find((a) => a.phase === "scanning")), 60_000)
    first.p.kill("SIGKILL")
    await first.p
    const lastSeq = (await fleet.assignment(held.reservationId)).lastSeq
    // Cut short, as a torn write leaves it.
    edit(state, (db) => db.prepare("UPDATE assignments SET doc = substr(doc, 1, 100) WHERE reservation_id = ?").run(held.reservationId))

    await fleet.seed(["acme/beside-the-record"])
    const second = runDevice(fleet, state, "demo:held", defer, { slots: 2 })
    expect((await fleet.settled(await fleet.reservationOf("acme/beside-the-record"))).outcome).toMatch(/^(clean|findings)$/)
    const released = () => second.out().split("\n").filter((l) => l.includes('"message":"released"') && l.includes(`"slot":${held.slot}`))
    await Poll.until("the release in the log", () => released().length > 0, 30_000, 50)
    expect(released()[0]).toContain(`the record of a reservation of this device (fleet ${held.fleetId}, reservation ${held.reservationId}) was damaged and set aside`)
    // Its journal, intact, is kept; nothing of it is waiting to be sent, and the server heard nothing more of it than the device's reason for the release.
    const journal = await peek(state, (s) => s.journal({ fleetId: held.fleetId, reservationId: held.reservationId }))
    expect(journal.length).toBeGreaterThan(0)
    expect(journal.filter((e) => e.delivery === "pending")).toEqual([])
    const ended = await fleet.assignment(held.reservationId)
    expect(ended.state).toBe("released")
    expect(ended.lastSeq).toBe(lastSeq + 1)
    expect((await fleet.timeline(held.reservationId)).at(-1)).toMatchObject({
      phase: "failed",
      detail: expect.stringContaining(`released by its device, whose local state has no record of it: the record of a reservation of this device (fleet ${held.fleetId}, reservation ${held.reservationId}) was damaged`)
    })
    expect(released()).toHaveLength(1)
    expect(second.out()).not.toContain("is busy at the server")
    second.p.kill("SIGTERM")
    expect((await second.p).exitCode).toBe(0)
  })
})
