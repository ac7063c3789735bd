import { PhaseModel } from "@scanfleet/core"
import { Cli, LocalState, Scanner, Supervisor } from "@scanfleet/worker"
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, afterEach, describe, expect, it } from "vitest"
import * as Fleet from "./support/Fleet.js"
import { currentMark, marked, useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"

useNoOrphans()

const fixture = (name: string) => fileURLToPath(new URL(`./fixtures/${name}`, import.meta.url))
const dir = mkdtempSync(join(tmpdir(), "scanfleet-device-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

const cleanups: Array<() => Promise<void>> = []
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
})

const until = <A>(what: string, f: () => Promise<A | undefined | null | false> | A | undefined | null | false, ms = 15_000): Promise<A> => Poll.until(what, f, ms, 25)

let n = 0
/** A server and a device on it; the device's events are collected. */
const setup = async (opts: {
  scanner: Scanner.ParsedSpec
  scanSeconds: number
  targets: Array<string>
  permits?: number
  graceMs?: number
  viaProxy?: boolean
}) => {
  const fleet = await Fleet.start({ scanSeconds: opts.scanSeconds })
  cleanups.push(() => fleet.close())
  const px = opts.viaProxy ? await Fleet.proxy(fleet.url) : null
  if (px) cleanups.push(() => px.close())
  await fleet.seed(opts.targets)
  const events: Array<Supervisor.DeviceEvent> = []
  const state = join(dir, `device-${++n}.db`)
  const workRoot = join(dir, `work-${n}`)
  mkdirSync(workRoot)
  const device = await Supervisor.start({
    server: px ? px.url : fleet.url,
    token: fleet.token,
    slots: 1,
    scanner: opts.scanner,
    state,
    workRoot,
    ...(opts.permits !== undefined ? { permits: opts.permits } : {}),
    graceMs: opts.graceMs ?? 300,
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
  const delivered = (id: number) =>
    until(`the result of ${id}`, () => events.find((e): e is Extract<Supervisor.DeviceEvent, { type: "delivered" }> => e.type === "delivered" && e.reservationId === id))
  const freed = (i = 0) => until("a slot to be freed", () => events.filter((e): e is Extract<Supervisor.DeviceEvent, { type: "slot_freed" }> => e.type === "slot_freed")[i])
  // Reads the journal after the device closed its state, from the file itself.
  const journal = async (id: number) => {
    const s = await LocalState.open(state)
    try {
      return await s.journal(id)
    } finally {
      await s.close()
    }
  }
  return { fleet, px, device, events, delivered, freed, stop, journal, state, workRoot }
}

describe("worker device against the scanfleet server", () => {
  it("Assignment completes normally", async () => {
    const t = await setup({ scanner: Scanner.demo({ delayMs: 100 }), scanSeconds: 10, targets: ["acme/app"] })
    const freed = await t.freed()
    const d = await t.delivered(freed.reservationId)
    expect(d.delivered.kind).toBe("accepted")
    await t.stop()
    const local = await t.journal(freed.reservationId)
    expect(local.map((e) => e.phase)).toEqual([
      "assigned", "permit_wait", "preparing", "scanning", "filtering", "cleanup", "staging", "bundling", "uploading", "awaiting_receipt", "completed"
    ])
    expect(local.map((e) => e.seq)).toEqual(local.map((_, i) => i + 1))
    // Everything up to awaiting_receipt went to the server; the last event stays local (the result closed the reservation).
    expect(local.slice(0, -1).every((e) => e.delivery === "acked")).toBe(true)
    expect(local.at(-1)?.delivery).toBe("local")
    const remote = await t.fleet.timeline(freed.reservationId)
    expect(remote.map((e) => [e.seq, e.phase])).toEqual(local.slice(0, -1).map((e) => [e.seq, e.phase]))
    // The timeline alone rebuilds the time spent in every phase from assigned through awaiting_receipt.
    const spans = PhaseModel.spans(remote.map(({ acceptedAt: _, ...e }) => e as PhaseModel.Event))
    expect(spans.map((s) => s.phase)).toEqual(remote.map((e) => e.phase))
    for (const s of spans.slice(0, -1)) expect(s.end! - s.start).toBeGreaterThanOrEqual(0)
    expect(Math.max(...remote.map((e) => e.at)) - remote[0].at).toBeGreaterThanOrEqual(100)
    const a = await t.fleet.assignment(freed.reservationId)
    expect(a.state).toBe("completed")
    expect(["clean", "findings"]).toContain(a.outcome)
  })

  it("Scanner child exceeds the deadline", async () => {
    const scanner = Scanner.command({ name: "stubborn", command: process.execPath, args: [fixture("stubborn-scanner.mjs"), join(dir, "{identity}.pids"), "escape"], exitCodes: { "0": "clean" } })
    const t = await setup({ scanner, scanSeconds: 3, targets: ["stubborn-1"], graceMs: 300 })
    const freed = await t.freed()
    expect(freed.end).toBe("deadline")
    // The slot is free within the grace period plus one second of the target-scan deadline.
    expect(freed.at - freed.scanDeadline).toBeLessThan(300 + 1000)
    // The scanner recorded its processes (their pids are the unit's own inside a PID namespace);
    // every process the test started carries its marker, so /proc finds any survivor wherever it went.
    expect(readFileSync(join(dir, "stubborn-1.pids"), "utf8").trim().split("\n").length).toBeGreaterThanOrEqual(2)
    expect(marked(currentMark()), "processes of the unit survived the deadline").toEqual([])
    const d = await t.delivered(freed.reservationId)
    expect(d.delivered.kind).toBe("accepted")
    const a = await t.fleet.assignment(freed.reservationId)
    expect(a.outcome).toBe("killed_at_deadline")
    expect(a.finalPhase).toBe("scanning")
    await t.stop()
    const local = await t.journal(freed.reservationId)
    expect(local.at(-1)).toMatchObject({ phase: "timed_out", delivery: "acked" })
    expect(local.at(-1)?.detail).toContain("fired during scanning")
    const remote = await t.fleet.timeline(freed.reservationId)
    expect(remote.at(-1)?.phase).toBe("timed_out")
    // The work directory went with the unit.
    expect(readdirSync(t.workRoot)).toEqual([])
  })

  it("Cleanup blocks after scanner exit", async () => {
    const scanner = Scanner.runnerModule({ name: "blocking", module: fixture("blocking-runner.mjs"), options: { block: "cleanup" } })
    const t = await setup({ scanner, scanSeconds: 4, targets: ["blocks-1", "blocks-2"] })
    const freed = await t.freed()
    expect(freed.end).toBe("deadline")
    expect(freed.at - freed.scanDeadline).toBeLessThan(300 + 1000)
    const d = await t.delivered(freed.reservationId)
    expect(d.delivered.kind).toBe("accepted")
    const a = await t.fleet.assignment(freed.reservationId)
    expect(a.outcome).toBe("killed_at_deadline")
    expect(a.finalPhase).toBe("cleanup")
    // The slot takes the next assignment long before the first one's assignment expiry.
    const next = await until("the next claim", () => t.events.find((e) => e.type === "claimed" && e.reservationId !== freed.reservationId))
    expect(next.type === "claimed" && next.at).toBeLessThan(a.expiresAt - 30_000)
    // The runner module is first-class in the timeline: its start is named, and the timeout knows it ran.
    const remote = await t.fleet.timeline(freed.reservationId)
    expect(remote.find((e) => e.phase === "preparing")?.detail).toBe("starting the runner blocking (default of blocking-runner.mjs)")
    expect(remote.at(-1)).toMatchObject({ phase: "timed_out" })
    expect(remote.at(-1)?.detail).not.toContain("never started")
    // Its ctx.log lines survive the kill: they are in the timeout result.
    const local = await LocalState.open(t.state)
    try {
      const r = await local.result(freed.reservationId)
      expect(r?.kind === "result" && r.body.log).toContain(`cleanup of blocks-1 is stuck`)
    } finally {
      await local.close()
    }
  })

  it("Permit acquisition consumes the budget", async () => {
    const scanner = Scanner.command({ name: "marker", command: process.execPath, args: [fixture("marker-scanner.mjs"), join(dir, "{identity}.marker")], exitCodes: { "0": "clean" } })
    const t = await setup({ scanner, scanSeconds: 3, targets: ["no-permit"], permits: 0 })
    const freed = await t.freed()
    expect(freed.end).toBe("deadline")
    await t.delivered(freed.reservationId)
    const a = await t.fleet.assignment(freed.reservationId)
    expect(a.outcome).toBe("killed_at_deadline")
    expect(a.finalPhase).toBe("permit_wait")
    expect(existsSync(join(dir, "no-permit.marker"))).toBe(false)
    await t.stop()
    const local = await t.journal(freed.reservationId)
    expect(local.map((e) => e.phase)).toEqual(["assigned", "permit_wait", "timed_out"])
    expect(local.at(-1)?.detail).toContain("the scanner never started")
  })

  it("Progress cannot reach the server", async () => {
    const t = await setup({ scanner: Scanner.demo({ delayMs: 400 }), scanSeconds: 10, targets: ["acme/offline"], viaProxy: true })
    const claimed = await until("a claim", () => t.events.find((e) => e.type === "claimed"))
    await t.px!.down()
    const id = claimed.type === "claimed" ? claimed.reservationId : 0
    // Execution continues under the fixed deadline while nothing gets through.
    await t.freed()
    const local = await LocalState.open(t.state)
    cleanups.push(() => local.close())
    const offline = await until("the upload stage", async () => {
      const j = await local.journal(id)
      return j.at(-1)?.phase === "awaiting_receipt" ? j : null
    })
    const pending = offline.filter((e) => e.delivery === "pending")
    expect(pending.length).toBeGreaterThan(3)
    const before = await t.fleet.timeline(id)
    // The server lacks the events made while it was cut off (one may have landed with its answer lost: a retry is a duplicate).
    expect(before.length).toBeLessThan(offline.length - 3)
    expect(before.length).toBeGreaterThanOrEqual(offline.length - pending.length)
    await new Promise((r) => setTimeout(r, 500))
    expect(t.events.some((e) => e.type === "retry")).toBe(true)
    await t.px!.up()
    const d = await t.delivered(id)
    expect(d.delivered.kind).toBe("accepted")
    const after = await t.fleet.timeline(id)
    // In order, exactly once, none lost: the server holds seq 1..n with the journal's content.
    expect(after.map((e) => e.seq)).toEqual(offline.map((_, i) => i + 1))
    expect(after.map((e) => [e.phase, e.at])).toEqual(offline.map((e) => [e.phase, e.at]))
    for (let i = 1; i < after.length; i++) expect(after[i].acceptedAt).toBeGreaterThanOrEqual(after[i - 1].acceptedAt)
    expect((await local.journal(id)).filter((e) => e.delivery === "pending")).toEqual([])
  })

  it("a second controller on the same state file is refused while the first one runs", async () => {
    const t = await setup({ scanner: Scanner.demo({ delayMs: 100 }), scanSeconds: 10, targets: [] })
    await expect(
      Supervisor.start({ server: t.fleet.url, token: t.fleet.token, slots: 1, scanner: Scanner.demo(), state: t.state })
    ).rejects.toMatchObject({ _tag: "StateInUse", pid: process.pid })
    await t.stop()
    // Stopped, it leaves the file to the next controller.
    const next = await Supervisor.start({ server: t.fleet.url, token: t.fleet.token, slots: 1, scanner: Scanner.demo(), state: t.state, onEvent: () => {} })
    await next.stop()
  })

  it("Operator inspects active work", async () => {
    const t = await setup({ scanner: Scanner.demo({ delayMs: 5000 }), scanSeconds: 10, targets: ["acme/busy"] })
    await until("scanning", async () => (await t.device.state.assignments({ open: true })).some((a) => a.phase === "scanning"))
    const text = await Cli.renderStatus(t.device.state, Date.now())
    expect(text).toContain("slot 0: reservation")
    expect(text).toContain("current phase: scanning")
    expect(text).toMatch(/target-scan deadline\s+\S+Z\s+in \d/)
    expect(text).toMatch(/result-upload deadline\s+\S+Z\s+in \d/)
    expect(text).toMatch(/assignment expiry\s+\S+Z\s+in \d/)
    expect(text).toContain("fires next: target-scan deadline in")
    expect(text).not.toMatch(/\bthe deadline\b/)
  })
})
