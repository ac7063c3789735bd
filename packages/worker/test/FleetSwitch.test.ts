import { Cli, LocalState, Scanner, Supervisor } from "@scanfleet/worker"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import pg from "pg"
import { afterAll, afterEach, describe, expect, inject, it } from "vitest"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"

useNoOrphans()

const dir = mkdtempSync(join(tmpdir(), "scanfleet-switch-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))
const cleanups: Array<() => Promise<void>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

/** A fresh PostgreSQL database on the suite's server; dropped after the test. */
const pgDatabase = async (): Promise<string> => {
  const superuser = inject("pgUrl")
  const name = `sf_switch_${Date.now().toString(36)}_${Math.random().toString(36).slice(2, 8)}`
  const admin = new pg.Client({ connectionString: superuser })
  await admin.connect()
  await admin.query(`CREATE DATABASE ${name}`)
  await admin.end()
  cleanups.push(async () => {
    const c = new pg.Client({ connectionString: superuser })
    await c.connect()
    await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    await c.end()
  })
  const url = new URL(superuser)
  url.pathname = `/${name}`
  return url.toString()
}

const until = <A>(what: string, f: () => A | undefined | null | false, ms = 30_000): Promise<A> => Poll.until(what, f, ms, 50)

/** Runs a device on `state` against `fleet` until `count` results of that fleet were delivered; then stops it. */
const runDevice = async (fleet: Fleet.Fleet, state: string, count: number) => {
  const events: Array<Supervisor.DeviceEvent> = []
  const device = await Supervisor.start({
    server: fleet.url,
    token: fleet.token,
    slots: 1,
    state,
    scanner: Scanner.demo({ delayMs: 50 }),
    pollMs: 50,
    minBackoffMs: 50,
    maxBackoffMs: 200,
    drainMs: 1000,
    onEvent: (e) => events.push(e)
  })
  try {
    const delivered = await until(`${count} results delivered to fleet ${fleet.fleetId}`, () => {
      const d = events.filter((e): e is Extract<Supervisor.DeviceEvent, { type: "delivered" }> => e.type === "delivered" && e.fleetId === fleet.fleetId)
      return d.length >= count ? d : null
    })
    return { delivered, events }
  } finally {
    await device.stop()
  }
}

describe("one device, one data folder, two fleets", () => {
  it("a device moved from a SQLite server to a PostgreSQL server with the same state folder completes both servers' assignments", async () => {
    const state = join(dir, "worker.db")
    const sqlite = await Fleet.start({ scanSeconds: 20, databaseUrl: `sqlite:${join(dir, "server-a.db")}` })
    cleanups.push(() => sqlite.close())
    await sqlite.seed(["acme/one", "acme/two"])
    const first = await runDevice(sqlite, state, 2)
    await sqlite.close()

    const postgres = await Fleet.start({ scanSeconds: 20, databaseUrl: await pgDatabase() })
    cleanups.push(() => postgres.close())
    expect(postgres.fleetId).not.toBe(sqlite.fleetId)
    await postgres.seed(["acme/one", "acme/two"])
    const second = await runDevice(postgres, state, 2)

    // The new database numbers its reservations from 1 again: the same ids, another fleet.
    const ids = (d: typeof first.delivered) => d.map((e) => e.reservationId).sort()
    expect(ids(second.delivered)).toEqual(ids(first.delivered))
    for (const e of [...first.delivered, ...second.delivered]) expect(e.delivered.kind).toBe("accepted")
    for (const id of ids(second.delivered)) expect(await postgres.assignment(id), JSON.stringify([await postgres.assignment(id), await postgres.timeline(id)])).toMatchObject({ state: "completed" })
    expect([...first.events, ...second.events].filter((e) => e.type === "error")).toEqual([])
    expect(second.events.find((e) => e.type === "registered")).toMatchObject({ fleetId: postgres.fleetId })

    const local = await LocalState.open(state)
    try {
      // Both fleets' timelines are whole and apart, each ending in its own receipt.
      for (const fleetId of [sqlite.fleetId, postgres.fleetId])
        for (const reservationId of ids(first.delivered)) {
          const journal = await local.journal({ fleetId, reservationId })
          expect(journal.map((e) => e.seq)).toEqual(journal.map((_, i) => i + 1))
          expect(journal[0].phase).toBe("assigned")
          expect(journal.at(-1)?.phase).toBe("completed")
          expect(journal.every((e) => e.fleetId === fleetId)).toBe(true)
        }
      const fleets = await local.fleets()
      expect(fleets.map((f) => f.fleetId)).toEqual([postgres.fleetId, sqlite.fleetId])
      expect(fleets.map((f) => [f.assignments, f.open, f.undelivered])).toEqual([[2, 0, 0], [2, 0, 0]])
      // `status` says which fleets the journal holds and which containment is in force.
      const text = await Cli.renderStatus(local, Date.now())
      expect(text).toContain(`fleet ${postgres.fleetId} via ${postgres.url}: 2 assignment(s), 0 open, 0 undelivered (reached most recently)`)
      expect(text).toContain(`fleet ${sqlite.fleetId} via ${sqlite.url}: 2 assignment(s), 0 open, 0 undelivered`)
      expect(text).toMatch(/^containment: (pid-namespace|cgroup-v2|cgroup-v1-freezer|freeze-kill) \(in force/)
    } finally {
      await local.close()
    }
  }, 90_000)
})
