import { Effect, Fiber } from "effect"
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Containment, ExecutionUnit, Permits, ProcessTree, Scanner, UnitProtocol } from "@scanfleet/worker"
import { useNoOrphans } from "./support/NoOrphans.js"
import * as Unit from "./support/Unit.js"

useNoOrphans()

const dir = mkdtempSync(join(tmpdir(), "scanfleet-unit-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))
beforeAll(() => Unit.build(), 120_000)

let n = 0
const supervise = (
  scanner: Scanner.ParsedSpec,
  opts: { deadlineMs: number; graceMs?: number; permits?: number; args?: Array<string>; limits?: UnitProtocol.OutputLimitsInput }
) => {
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
      scanDeadline: deadline,
      ...(opts.limits ? { limits: opts.limits } : {})
    },
    childPath: Unit.unitPath,
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

const recorded = (file: string): Array<number> => (existsSync(file) ? readFileSync(file, "utf8").trim().split("\n").filter(Boolean).map(Number) : [])

describe("the scan-stage watchdog", () => {
  it("runs under the strongest containment the device allows, or the one SCANFLEET_CONTAINMENT forces", async () => {
    const plan = await Effect.runPromise(Containment.detect())
    expect(plan.level).toBe(plan.available[0])
    expect((await Effect.runPromise(Containment.detect({ env: { SCANFLEET_CONTAINMENT: "freeze-kill" } }))).level).toBe("freeze-kill")
    const bad = await Effect.runPromise(Effect.flip(Containment.detect({ force: "chroot" })))
    expect(bad).toMatchObject({ _tag: "ContainmentError", reason: "unknown_level", level: "chroot" })
    const u = supervise(command("exit"), { deadlineMs: 20_000, args: [Unit.adversary("exit-code"), "0"] })
    const end = await u.end
    expect(end.level).toBe((await ExecutionUnit.defaultContainment()).level)
  })

  it("goes straight to SIGKILL for a scanner that restarts on SIGTERM when its stop says so", async () => {
    const pidFile = join(dir, "restart.pids")
    const u = supervise(command("restart", "SIGKILL"), { deadlineMs: 5000, args: [Unit.adversary("restart-on-term"), pidFile] })
    const end = await u.end
    expect(end.kind).toBe("deadline")
    if (end.kind !== "deadline") return
    expect(end.signals).toEqual(["SIGKILL"])
    // No SIGTERM was sent, so it never restarted: exactly one copy ever ran.
    expect(recorded(pidFile)).toHaveLength(1)
    expect(ProcessTree.isAlive(recorded(pidFile)[0])).toBe(false)
  })

  it("a blocking staging is ended by the same deadline", async () => {
    const pidFile = join(dir, "staging.pids")
    const spec = Scanner.runnerModule({ name: "blocking", module: Unit.adversary("blocked-cleanup"), options: { pidFile, block: "staging" } })
    const u = supervise(spec, { deadlineMs: 5000 })
    const end = await u.end
    expect(end.kind).toBe("deadline")
    if (end.kind !== "deadline") return
    expect(end.phase).toBe("staging")
    expect(end.log).toContain("staging blocks now")
    expect(end.settledAt - u.deadline).toBeLessThan(300 + 1000)
  })

  it("a permit never granted ends in permit_wait and the scanner never starts", async () => {
    const marker = join(dir, "permit.pids")
    const u = supervise(command("marker"), { deadlineMs: 6000, permits: 0, args: [Unit.adversary("hold-stdout"), marker] })
    const end = await u.end
    expect(end.kind).toBe("deadline")
    if (end.kind !== "deadline") return
    expect(end.phase).toBe("permit_wait")
    expect(end.scannerStarted).toBe(false)
    expect(existsSync(marker)).toBe(false)
    expect(u.phases).toEqual(["permit_wait"])
  })

  it("a scanner that finishes in time stages its exit, findings and bounded log", async () => {
    const u = supervise(command("exit"), { deadlineMs: 20_000, args: [Unit.adversary("exit-code"), "3", "2"] })
    const end = await u.end
    expect(end.kind).toBe("staged")
    if (end.kind !== "staged") return
    expect(end.staged).toMatchObject({ kind: "exit", code: 3, malformed: 1 })
    expect(end.staged.findings).toHaveLength(2)
    expect(end.staged.log).toContain("exiting with 3")
    expect(end.staged.log).toContain("1 stdout line(s) were not JSON objects")
    expect(u.phases).toEqual(["permit_wait", "preparing", "scanning", "filtering", "cleanup", "staging"])
    expect(end.settledAt).toBeLessThan(u.deadline)
  })

  it("a helper the scanner left still writing into the work folder does not cost a finished scan its result: the findings are staged and the helper dies with the unit", async () => {
    const pidFile = join(dir, "leftover.pids")
    const u = supervise(command("leftover"), { deadlineMs: 20_000, args: [Unit.adversary("leftover-writer"), pidFile] })
    const end = await u.end
    expect(end.kind, end.kind === "failed" ? end.message : "").toBe("staged")
    if (end.kind !== "staged") return
    expect(end.staged).toMatchObject({ kind: "exit", code: 3, findings: [{ detector: "LeftoverWriter", file: "config.yml" }] })
    expect(u.phases.at(-1)).toBe("staging")
    expect(recorded(pidFile)).toHaveLength(2)
    for (const pid of recorded(pidFile)) expect(ProcessTree.isAlive(pid), `pid ${pid} survived`).toBe(false)
  })

  it("findings beyond the output limits are cut, and the result says how many", async () => {
    const u = supervise(command("exit"), { deadlineMs: 20_000, args: [Unit.adversary("exit-code"), "0", "50"], limits: { maxFindings: 7, maxStdoutFileBytes: 100 } })
    const end = await u.end
    expect(end.kind).toBe("staged")
    if (end.kind !== "staged") return
    expect(end.staged.findings.map((f) => f.index)).toEqual([0, 1, 2, 3, 4, 5, 6])
    expect(end.staged.cut).toMatchObject({ findings: 43, longLines: 0, unstoredBytes: end.staged.cut!.stdoutBytes - 100 })
    expect(end.staged.log).toContain("43 finding(s) cut at the limits (7 findings")
  })

  it("a staged file larger than any unit writes is refused unread", async () => {
    const file = join(dir, "huge.json")
    writeFileSync(file, "x".repeat(UnitProtocol.defaultLimits.maxFindingsBytes + UnitProtocol.defaultLimits.maxLogChars * 4 + 64 * 1024 + 1))
    await expect(UnitProtocol.readStaged(file)).rejects.toThrow(/more than the \d+ a unit writes/)
  })

  it("as an Effect, interrupting the supervision empties the unit's box before it completes", async () => {
    const pidFile = join(dir, "interrupt.pids")
    const deadline = Date.now() + 60_000
    const fiber = Effect.runFork(
      ExecutionUnit.supervise({
        job: {
          reservationId: 999,
          target: { id: 999, source: "github", identity: "acme/interrupt" },
          workDir: join(dir, "work-interrupt"),
          stageFile: join(dir, "stage-interrupt.json"),
          scanner: command("trap"),
          args: [Unit.adversary("term-trap"), pidFile],
          acquireArgs: [],
          scanDeadline: deadline
        },
        deadline,
        graceMs: 300,
        permits: Permits.make(1),
        childPath: Unit.unitPath,
        onSpawn: async () => {},
        onPhase: async () => {}
      })
    )
    for (let i = 0; i < 1000 && recorded(pidFile).length === 0; i++) await new Promise((r) => setTimeout(r, 20))
    expect(recorded(pidFile)).toHaveLength(1)
    await Effect.runPromise(Fiber.interrupt(fiber))
    for (const pid of recorded(pidFile)) expect(ProcessTree.isAlive(pid), `pid ${pid} survived`).toBe(false)
  })
})

describe("the shipped trufflehog plug-in", () => {
  it("runs the command with its per-source arguments and maps exit 183 to findings", async () => {
    const spec = Scanner.trufflehog({ command: Unit.adversary("fake-trufflehog") })
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
