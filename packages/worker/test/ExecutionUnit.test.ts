import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, describe, expect, it } from "vitest"
import { ExecutionUnit, Permits, ProcessTree, Scanner } from "@scanfleet/worker"
import { useNoOrphans } from "./support/NoOrphans.js"

useNoOrphans()

const fixture = (name: string) => fileURLToPath(new URL(`./fixtures/${name}`, import.meta.url))
const dir = mkdtempSync(join(tmpdir(), "scanfleet-unit-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

let n = 0
const supervise = (scanner: Scanner.ParsedSpec, opts: { deadlineMs: number; graceMs?: number; permits?: number; args?: Array<string> }) => {
  const id = ++n
  const phases: Array<string> = []
  let runner: { pid: number; pgid: number } | null = null
  const deadline = Date.now() + opts.deadlineMs
  const end = ExecutionUnit.run({
    job: {
      reservationId: id,
      target: { id, source: "github", identity: `acme/repo-${id}` },
      workDir: join(dir, `work-${id}`),
      stageFile: join(dir, `stage-${id}.json`),
      scanner,
      args: opts.args ?? [],
      acquireArgs: [],
      scanDeadline: deadline
    },
    deadline,
    graceMs: opts.graceMs ?? 300,
    permits: Permits.make(opts.permits ?? 1),
    onSpawn: async (r) => {
      runner = r
    },
    onPhase: async (p) => {
      phases.push(p)
    }
  }).then((e) => ({ ...e, settledAt: Date.now() }))
  return { end, phases, deadline, runner: () => runner! }
}

const command = (file: string, stop: "SIGTERM" | "SIGKILL" = "SIGTERM") =>
  Scanner.command({ name: file, command: process.execPath, args: [], exitCodes: { "0": "clean", "3": "findings" }, stop })

describe("the scan-stage watchdog", () => {
  it("kills a scanner tree that ignores SIGTERM and holds stdout open: nothing survives, settled within grace + 1 s", async () => {
    const pidFile = join(dir, "stubborn.pids")
    const u = supervise(command("stubborn"), { deadlineMs: 2500, graceMs: 300, args: [fixture("stubborn-scanner.mjs"), pidFile, "escape"] })
    const end = await u.end
    expect(end.kind).toBe("deadline")
    if (end.kind !== "deadline") return
    expect(end.phase).toBe("scanning")
    expect(end.signals).toEqual(["SIGTERM", "SIGKILL"])
    expect(end.survivors).toEqual([])
    expect(end.settledAt - u.deadline).toBeLessThan(300 + 1000)
    const tree = readFileSync(pidFile, "utf8").trim().split("\n").map(Number)
    expect(tree).toHaveLength(4)
    // The runner, the scanner and its grandchildren, even the one that left the group: none is alive (zombies awaiting a reaper are dead).
    for (const pid of [u.runner().pid, ...tree]) {
      const s = ProcessTree.stat(pid)
      expect(s === null || s.state === "Z", `pid ${pid} survived`).toBe(true)
    }
    expect(ProcessTree.members(u.runner().pgid)).toEqual([])
    expect(u.phases).toEqual(["permit_wait", "preparing", "scanning"])
  })

  it("goes straight to SIGKILL for a scanner that restarts on SIGTERM (the trufflehog rule)", async () => {
    const pidFile = join(dir, "restart.pids")
    const u = supervise(command("restart", "SIGKILL"), { deadlineMs: 2500, args: [fixture("restart-on-term.mjs"), pidFile] })
    const end = await u.end
    expect(end.kind).toBe("deadline")
    if (end.kind !== "deadline") return
    expect(end.signals).toEqual(["SIGKILL"])
    // No SIGTERM was sent, so it never restarted: exactly one copy ever ran.
    expect(readFileSync(pidFile, "utf8").trim().split("\n")).toHaveLength(1)
    expect(Scanner.trufflehog().stop).toBe("SIGKILL")
  })

  it("a blocking cleanup after the scanner exited is ended by the same deadline", async () => {
    const done = join(dir, "cleanup.done")
    const u = supervise(Scanner.runnerModule({ name: "blocking", module: fixture("blocking-runner.mjs"), options: { block: "cleanup", scannerDone: done } }), { deadlineMs: 3000 })
    const end = await u.end
    expect(existsSync(done)).toBe(true)
    expect(end.kind).toBe("deadline")
    expect(end.phase).toBe("cleanup")
    expect(end.settledAt - u.deadline).toBeLessThan(300 + 1000)
  })

  it("a blocking staging is ended by the same deadline", async () => {
    const u = supervise(Scanner.runnerModule({ name: "blocking", module: fixture("blocking-runner.mjs"), options: { block: "staging" } }), { deadlineMs: 3000 })
    const end = await u.end
    expect(end.kind).toBe("deadline")
    expect(end.phase).toBe("staging")
  })

  it("a permit never granted ends in permit_wait and the scanner never starts", async () => {
    const marker = join(dir, "permit.marker")
    const u = supervise(command("marker"), { deadlineMs: 2500, permits: 0, args: [fixture("marker-scanner.mjs"), marker] })
    const end = await u.end
    expect(end.kind).toBe("deadline")
    if (end.kind !== "deadline") return
    expect(end.phase).toBe("permit_wait")
    expect(end.scannerStarted).toBe(false)
    expect(existsSync(marker)).toBe(false)
    expect(u.phases).toEqual(["permit_wait"])
  })

  it("a scanner that finishes in time stages its exit, findings and bounded log", async () => {
    const u = supervise(command("exit"), { deadlineMs: 5000, args: [fixture("exit-code-scanner.mjs"), "3", "2"] })
    const end = await u.end
    expect(end.kind).toBe("staged")
    if (end.kind !== "staged") return
    expect(end.staged).toMatchObject({ kind: "exit", code: 3, malformed: 1 })
    expect(end.staged.findings).toHaveLength(2)
    expect(end.staged.log).toContain("exiting with 3")
    expect(u.phases).toEqual(["permit_wait", "preparing", "scanning", "filtering", "cleanup", "staging"])
    expect(end.settledAt).toBeLessThan(u.deadline)
  })
})

describe("the shipped trufflehog plug-in", () => {
  it("runs the command with its per-source arguments and maps exit 183 to findings", async () => {
    const spec = Scanner.trufflehog({ command: fixture("fake-trufflehog.mjs") })
    const args = Scanner.expand(spec.kind === "command" ? spec.args : [], { source: "github", identity: "acme/repo", workDir: dir, targetId: 1 })
    const u = supervise(spec, { deadlineMs: 10_000, args: [...args] })
    const end = await u.end
    expect(end.kind).toBe("staged")
    if (end.kind !== "staged") return
    expect(Scanner.classify(spec, end.staged)).toBe("findings")
    expect(end.staged.findings).toEqual([expect.objectContaining({ DetectorName: "AWS" })])
    expect(end.staged.log).toContain("TruffleHog")
  })
})

describe("exit-code tables", () => {
  const staged = (code: number): Scanner.Staged => ({ kind: "exit", code, signal: null, findings: [], malformed: 0, log: "" })
  it("exit 0 is clean only when the scanner's table says so", () => {
    const strict = Scanner.command({ name: "s", command: "x", args: [], exitCodes: { "1": "clean" } })
    expect(Scanner.classify(strict, staged(0))).toBe("scan_error")
    expect(Scanner.classify(strict, staged(1))).toBe("clean")
  })
  it("trufflehog: 183 means findings, 0 clean, anything else an error; a signal death is an error", () => {
    const th = Scanner.trufflehog()
    expect(Scanner.classify(th, staged(183))).toBe("findings")
    expect(Scanner.classify(th, staged(0))).toBe("clean")
    expect(Scanner.classify(th, staged(1))).toBe("scan_error")
    expect(Scanner.classify(th, { kind: "exit", code: null, signal: "SIGKILL", findings: [], malformed: 0, log: "" })).toBe("scan_error")
  })
  it("the demo scanner maps 3 to findings, 2 to usage and 4 to unsupported", () => {
    const d = Scanner.demo()
    expect([0, 3, 2, 4, 1].map((c) => Scanner.classify(d, staged(c)))).toEqual(["clean", "findings", "usage", "unsupported", "scan_error"])
  })
})
