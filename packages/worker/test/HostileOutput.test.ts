import { mkdirSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, describe, expect, it } from "vitest"
import { Scanner, Supervisor } from "../src/index.js"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Poll from "./support/Poll.js"

/**
 * A scanner whose output breaks the result contract (fixtures/hostile-findings.mjs): the device
 * leaves out each finding the server would refuse and sends the rest, so the server accepts the
 * result, the reservation ends and the slot is free; nothing is a scan error.
 */
useNoOrphans()

const dir = mkdtempSync(join(tmpdir(), "scanfleet-hostile-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

const until = <A>(what: string, f: () => A | undefined | Promise<A | undefined>, ms = 30_000): Promise<A> => Poll.until(what, f, ms, 50)

describe("a scanner whose findings the server would refuse", () => {
  it("the result is accepted with the conforming findings and a log saying what was left out; the reservation ends and the slot is free", async () => {
    const fleet = await Fleet.start({ scanSeconds: 30 })
    const events: Array<Supervisor.DeviceEvent> = []
    mkdirSync(join(dir, "work"))
    const scanner = Scanner.command({
      name: "hostile",
      command: process.execPath,
      args: [fileURLToPath(new URL("./fixtures/hostile-findings.mjs", import.meta.url))],
      exitCodes: { "0": "findings" },
      findings: { secretFields: ["token"], detector: "detector", path: "file" }
    })
    const device = await Supervisor.start({ server: fleet.url, token: fleet.token, slots: 1, scanner, state: join(dir, "device.db"), workRoot: join(dir, "work"), pollMs: 50, minBackoffMs: 50, maxBackoffMs: 200, drainMs: 500, onEvent: (e) => events.push(e) })
    try {
      await fleet.seed(["acme/hostile"])
      const delivered = await until("the result", () => events.find((e): e is Extract<Supervisor.DeviceEvent, { type: "delivered" }> => e.type === "delivered"))
      expect(delivered.delivered.kind, JSON.stringify(delivered)).toBe("accepted")
      const a = await fleet.assignment(delivered.reservationId)
      const [first] = await device.state.assignments({ limit: 1 })
      const body = await device.state.result(first)
      expect([a.state, a.outcome], JSON.stringify(body).slice(-1500)).toEqual(["completed", "findings"])
      const stored = await fleet.findings()
      // a detector past its length is cut by redaction, not refused
      expect(stored.map((f) => [f.detector.slice(0, 4), f.detector.length, f.path]).sort()).toEqual([["dddd", 500, "f"], ["good", 4, "good/1.env"], ["good", 4, "good/2.env"]])
      // the body the device sent, from its own state
      const [record] = await device.state.assignments({ limit: 1 })
      const sent = await device.state.result(record)
      const log = sent?.kind === "result" ? sent.body.log : ""
      expect(log).toContain("left out, the server would refuse it")
      expect(log).toContain("findings left out in all")
      expect(JSON.stringify(sent).includes("\\u0000")).toBe(false)
      // no secret of a left-out finding reached the server in the clear
      for (const secret of ["tok_FAKE_nul", "tok_FAKE_long", "tok_FAKE_key", "tok_FAKE_deep", "tok_FAKE_detector"]) expect(JSON.stringify(sent)).not.toContain(secret)
      expect(events.some((e) => e.type === "error")).toBe(false)
    } finally {
      await device.stop()
      await fleet.close()
    }
  }, 90_000)

  it("a device run with more slots than it was registered with says so once, at registration, and its extra slots stay idle instead of being refused every poll", async () => {
    const fleet = await Fleet.start({ scanSeconds: 30, slots: 1 })
    const events: Array<Supervisor.DeviceEvent> = []
    mkdirSync(join(dir, "work2"))
    const device = await Supervisor.start({ server: fleet.url, token: fleet.token, slots: 3, scanner: Scanner.demo({ delayMs: 50 }), state: join(dir, "device2.db"), workRoot: join(dir, "work2"), pollMs: 20, minBackoffMs: 50, maxBackoffMs: 200, drainMs: 500, onEvent: (e) => events.push(e) })
    try {
      await fleet.seed(["acme/one"])
      const delivered = await until("the result of slot 0", () => events.find((e): e is Extract<Supervisor.DeviceEvent, { type: "delivered" }> => e.type === "delivered"))
      expect(delivered.delivered.kind).toBe("accepted")
      // long enough for dozens of polls by the extra slots
      await new Promise((r) => setTimeout(r, 1000))
      const errors = events.filter((e): e is Extract<Supervisor.DeviceEvent, { type: "error" }> => e.type === "error").map((e) => e.message)
      expect(errors).toEqual([expect.stringContaining("registered with 1 slot(s) and runs 3: slots 1 to 2 stay idle")])
    } finally {
      await device.stop()
      await fleet.close()
    }
  }, 90_000)
})
