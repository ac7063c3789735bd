import Sqlite from "better-sqlite3"
import type { LocalState } from "@scanfleet/worker"
import { copyFileSync, readFileSync, rmSync, statSync, truncateSync } from "node:fs"
import { join } from "node:path"
import { expect } from "vitest"
import { runDevice } from "./Controller.js"
import * as Fleet from "./Fleet.js"
import * as Poll from "./Poll.js"
import { peek } from "./State.js"
import { sleepyScanner } from "./Unit.js"

/**
 * A result stranded on a device: the device scanned a target and queued the
 * result while the server could not be reached, then was killed (SIGKILL).
 * Its state files are as a crash leaves them, for a test to damage before the
 * device is started again with the network back.
 */
export interface Stranded {
  readonly fleet: Fleet.Fleet
  readonly proxy: Fleet.Proxy
  readonly state: string
  readonly scanner: string
  /** The assignment as the device last recorded it. */
  readonly assignment: LocalState.AssignmentRecord
}

let n = 0

/** Runs a scan of `identity` (1.5 s, one finding) in `dir` to a queued result that cannot leave, then kills the device. */
export const strand = async (dir: string, identity: string, defer: (cleanup: () => Promise<unknown>) => void): Promise<Stranded> => {
  const fleet = await Fleet.start({ scanSeconds: 20, uploadSeconds: 60, ttlSeconds: 120, slots: 1 })
  defer(() => fleet.close())
  const proxy = await Fleet.proxy(fleet.url)
  defer(() => proxy.close())
  await fleet.seed([identity])
  const state = join(dir, `stranded-${++n}.db`)
  const scanner = sleepyScanner(join(dir, `sleepy-${n}.json`), join(dir, `stranded-${n}.pids`), 1500)
  const first = runDevice({ url: proxy.url, token: fleet.token }, state, scanner, defer)
  const scanning = await Poll.until("the scan to start", () => peek(state, async (s) => (await s.assignments({ open: true })).find((x) => x.phase === "scanning")), 60_000)
  // The server has heard the scan's first events before the network goes down.
  await Poll.until("the server to hear the first events", async () => ((await fleet.timeline(scanning.reservationId)).length >= 2 ? true : null), 30_000)
  await proxy.down()
  // Read before the kill: opening the file after it would checkpoint the WAL that `powerCut` cuts.
  const assignment = await Poll.until(
    "the result to be queued",
    () => peek(state, async (s) => ((await s.result(scanning.reservationId)) !== null ? s.assignment(scanning.reservationId) : null)),
    60_000
  )
  first.p.kill("SIGKILL")
  await first.p
  return { fleet, proxy, state, scanner, assignment }
}

/** Starts the stranded device again with the network back; resolves with the server's settled reservation once the device stopped cleanly. */
export const deliver = async (s: Stranded, defer: (cleanup: () => Promise<unknown>) => void) => {
  await s.proxy.up()
  const device = runDevice({ url: s.proxy.url, token: s.fleet.token }, s.state, s.scanner, defer)
  const done = await s.fleet.settled(s.assignment.reservationId)
  device.p.kill("SIGTERM")
  expect((await device.p).exitCode).toBe(0)
  return { done, findings: await s.fleet.findings(), out: device.out() }
}

/** Queued results in a state file whose WAL is cut to `bytes`, read from a copy. */
const queuedWith = (state: string, bytes: number): number => {
  const copy = `${state}.cut-copy`
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

/**
 * Drops whole frames from the end of the WAL of a stopped device until the queued result is gone, as a
 * power cut does to commits never synced (the state file is written with synchronous = NORMAL).
 */
export const powerCut = (state: string): void => {
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
