import { LocalState, Scanner, Supervisor } from "@scanfleet/worker"
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, afterEach, describe, expect, it } from "vitest"
import * as Fleet from "./support/Fleet.js"
import { currentMark, marked, useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"

useNoOrphans()

const fixture = (name: string) => fileURLToPath(new URL(`./fixtures/${name}`, import.meta.url))
const dir = mkdtempSync(join(tmpdir(), "scanfleet-cancel-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

const cleanups: Array<() => Promise<void>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

const until = <A>(what: string, f: () => A | undefined | null | false, ms = 15_000): Promise<A> => Poll.until(what, f, ms, 10)

const graceMs = 300
const watchMs = 200
type Freed = Extract<Supervisor.DeviceEvent, { type: "slot_freed" }>
type Claimed = Extract<Supervisor.DeviceEvent, { type: "claimed" }>

let n = 0
/** A device whose one slot runs a scanner that ignores SIGTERM and never exits, on a long target-scan deadline. */
const setup = async () => {
  const fleet = await Fleet.start({ scanSeconds: 120, ttlSeconds: 300 })
  cleanups.push(() => fleet.close())
  await fleet.seed(["stuck/one"])
  const events: Array<Supervisor.DeviceEvent> = []
  const state = join(dir, `device-${++n}.db`)
  const workRoot = join(dir, `work-${n}`)
  mkdirSync(workRoot)
  const pids = join(dir, `pids-${n}`)
  const device = await Supervisor.start({
    server: fleet.url,
    token: fleet.token,
    slots: 1,
    scanner: Scanner.command({ name: "stubborn", command: process.execPath, args: [fixture("stubborn-scanner.mjs"), pids, "escape"], exitCodes: { "0": "clean" } }),
    state,
    workRoot,
    graceMs,
    watchMs,
    pollMs: 50,
    minBackoffMs: 50,
    maxBackoffMs: 200,
    drainMs: 500,
    onEvent: (e) => events.push(e)
  })
  let stopped = false
  const stop = async () => {
    if (!stopped) (stopped = true), await device.stop()
  }
  cleanups.push(stop)
  // The scanner and its grandchildren are up (the pid file is written once they all are).
  const claimed = await until("the first claim", () => events.find((e): e is Claimed => e.type === "claimed"))
  await until("the scanner's processes", () => existsSync(pids) && marked(currentMark()).length >= 4).catch((e) => { throw new Error(`${e.message}: ${JSON.stringify(events)} ${JSON.stringify(marked(currentMark()))}`) })
  const journal = async (id: number) => {
    const s = await LocalState.open(state)
    try {
      return await s.journal(id)
    } finally {
      await s.close()
    }
  }
  return { fleet, events, claimed, stop, journal }
}

describe("the worker side of a cancel", () => {
  it("an operator cancels a running assignment through the admin API: the unit is killed at once (gone from /proc within grace + 1 s), the slot claims again, and the journal ends naming the cancellation without retrying the refused writes", async () => {
    const t = await setup()
    const id = t.claimed.reservationId
    const cancelledAt = Date.now()
    await t.fleet.cancel(id, "wrong repository, scanned by mistake")
    // The seeded target comes after the cancel, so the slot's next claim can only happen once it is free.
    await t.fleet.seed(["next/two"])
    await until("the scanner's processes to be gone", () => marked(currentMark()).length === 0, graceMs + watchMs + 1000 + 2000)
    const goneAt = Date.now()
    expect(goneAt - cancelledAt, "the unit outlived the cancel by more than the watch interval, the grace and one second").toBeLessThan(watchMs + graceMs + 1000)
    const freed = await until("the slot to be freed", () => t.events.find((e): e is Freed => e.type === "slot_freed" && e.reservationId === id))
    expect(freed.end).toBe("cancelled")
    expect(freed.at).toBeLessThan(freed.scanDeadline)
    const again = await until("the slot to claim again", () => t.events.find((e): e is Claimed => e.type === "claimed" && e.reservationId !== id))
    expect(again.slot).toBe(t.claimed.slot)
    const delivered = t.events.find((e) => e.type === "delivered" && e.reservationId === id)
    expect(delivered).toMatchObject({ delivered: { kind: "refused" } })
    // Let the outbox run a few passes: a refused write is kept with its reason, never retried.
    await new Promise((r) => setTimeout(r, 600))
    expect(t.events.filter((e) => e.type === "retry" && e.reservationId === id)).toEqual([])
    await t.stop()
    const local = await t.journal(id)
    expect(local.at(-1)).toMatchObject({ phase: "failed", delivery: "local" })
    expect(local.at(-1)?.detail).toContain("reservation_refused:cancelled")
    expect(local.at(-1)?.detail).toContain("wrong repository, scanned by mistake")
    expect(local.at(-1)?.detail).toContain("SIGKILL")
    expect(local.filter((e) => e.delivery === "pending")).toEqual([])
    // The server's record is the cancel's: the refused terminal event never reached it.
    const a = await t.fleet.assignment(id)
    expect(a.state).not.toBe("active")
    expect((await t.fleet.timeline(id)).map((e) => e.phase)).not.toContain("failed")
  })

  it("revoking the device kills its running unit at once and the device claims nothing more", async () => {
    const t = await setup()
    const id = t.claimed.reservationId
    const revokedAt = Date.now()
    await t.fleet.revoke("the laptop was stolen")
    await until("the scanner's processes to be gone", () => marked(currentMark()).length === 0, graceMs + watchMs + 1000 + 2000).catch((e) => {
      throw new Error(`${e.message}: ${JSON.stringify(t.events)}`)
    })
    expect(Date.now() - revokedAt).toBeLessThan(watchMs + graceMs + 1000)
    const freed = await until("the slot to be freed", () => t.events.find((e): e is Freed => e.type === "slot_freed" && e.reservationId === id))
    expect(freed.end).toBe("cancelled")
    await t.fleet.seed(["next/three"])
    await new Promise((r) => setTimeout(r, 500))
    expect(t.events.filter((e) => e.type === "claimed")).toHaveLength(1)
    await t.stop()
    const local = await t.journal(id)
    expect(local.at(-1)).toMatchObject({ phase: "failed", delivery: "local" })
    expect(local.at(-1)?.detail).toContain("401")
  })
})
