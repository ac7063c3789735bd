import { Effect } from "effect"
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Containment, ExecutionUnit, Permits, ProcessTree, Scanner, Supervisor } from "@scanfleet/worker"
import * as Fleet from "./Fleet.js"
import { useNoOrphans } from "./NoOrphans.js"
import * as Unit from "./Unit.js"

/**
 * Adversarial scanners under one containment level, shared by the
 * Containment.<level>.test.ts files: one file per level, so the levels (each
 * mostly waiting out deadlines and grace periods) run in parallel test
 * processes. Whatever a scanner does, every process it started is dead within
 * grace + 1 s of the deadline, and the end names the phase and the outcome.
 * Pids are read back from what each process recorded and checked in /proc.
 */

/** What this machine provides, detected for real. */
export const plan = await Effect.runPromise(Containment.detect())
// CI runs as root, where every level is there: none may quietly go missing.
if (process.getuid?.() === 0 && process.platform === "linux") expect(plan.available).toEqual([...Containment.levels])

export const GRACE = 300
/** The Supervisor's default SIGTERM grace: scanners that act on SIGTERM get it, so they act. */
export const DEFAULT_GRACE = 2000
/** Long enough for a unit, its scanner and their children to be running on a loaded 2-core machine. */
export const DEADLINE = 8000

/** Waits until `ok()` holds or `by` (epoch ms) passes; says which. */
export const until = async (ok: () => boolean, by: number): Promise<boolean> => {
  while (!ok()) {
    if (Date.now() >= by) return false
    await new Promise((r) => setTimeout(r, 20))
  }
  return true
}

/** A scanner run by node, with the adversary script as its first argument. */
export const node = (name: string, stop: "SIGTERM" | "SIGKILL" = "SIGTERM") =>
  Scanner.command({ name, command: process.execPath, args: [], exitCodes: { "0": "clean", "3": "findings" }, stop })

/** The pids a scanner's processes recorded in `file`. */
export const recorded = (file: string): Array<number> => (existsSync(file) ? readFileSync(file, "utf8").trim().split("\n").filter(Boolean).map(Number) : [])
/** Those of `pids` still alive. */
export const alive = (pids: ReadonlyArray<number>) => pids.filter((p) => ProcessTree.isAlive(p))

/**
 * Installs, in the calling test file, the no-orphans check, a scratch folder
 * and the bundled unit, and describes every adversarial scenario under
 * `level`. On a machine without the level (not root, not Linux) the
 * scenarios are skipped and say so; as root on Linux the check above fails
 * the file instead.
 */
export const levelSuites = (level: Containment.Level): void => {
  useNoOrphans()
  const dir = mkdtempSync(join(tmpdir(), `scanfleet-contain-${level}-`))
  afterAll(() => rmSync(dir, { recursive: true, force: true }))
  beforeAll(() => Unit.build(), 120_000)
  let n = 0

  const supervise = (
    level: Containment.Level,
    scanner: Scanner.ParsedSpec,
    opts: { deadlineMs: number; graceMs?: number; args?: ReadonlyArray<string>; permits?: Permits.Permits; limits?: ExecutionUnit.Job["limits"] }
  ) => {
    const id = ++n
    const deadline = Date.now() + opts.deadlineMs
    const containment = Effect.runSync(Containment.withLevel(plan, level))
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
      deadline,
      graceMs: opts.graceMs ?? GRACE,
      permits: opts.permits ?? Permits.make(1),
      containment,
      childPath: Unit.unitPath,
      onSpawn: async () => {},
      onPhase: async () => {}
    }).then((e) => ({ ...e, settledAt: Date.now() }))
    return { end, deadline }
  }

  const here = plan.available.includes(level)
  describe.skipIf(!here)(`containment ${level}`, () => {
    it("restart-on-SIGTERM scanner forking setsid copies during the grace: every copy is dead within grace + 1 s, killed_at_deadline in scanning", async () => {
      const pids = join(dir, `restart-${level}.pids`)
      const u = supervise(level, node("restart"), { deadlineMs: DEADLINE, graceMs: DEFAULT_GRACE, args: [Unit.adversary("restart-on-term"), pids] })
      expect(await until(() => recorded(pids).length >= 1, u.deadline), "the scanner was running at its deadline").toBe(true)
      // When was every copy recorded so far dead? Looked at every 10 ms until the unit settles.
      let goneAt: number | undefined
      const watch = setInterval(() => {
        const copies = recorded(pids)
        if (copies.length > 0 && alive(copies).length === 0) goneAt ??= Date.now()
        else goneAt = undefined
      }, 10)
      const end = await u.end.finally(() => clearInterval(watch))
      // dead by the time it settled, faster than the watch looked: the settling is the bound
      if (goneAt === undefined && alive(recorded(pids)).length === 0) goneAt = end.settledAt
      // A copy killed as the box emptied can still be exiting when the unit settles: the kernel has
      // already taken it out of what the box looks at (its cgroup, its environment) but not yet made
      // it a zombie. Looked at until the title's bound, past which it would be a copy that escaped.
      if (goneAt === undefined && (await until(() => alive(recorded(pids)).length === 0, u.deadline + DEFAULT_GRACE + 1000))) goneAt = Date.now()
      expect(end.kind).toBe("deadline")
      if (end.kind !== "deadline") return
      expect(end.level).toBe(level)
      expect(end.phase).toBe("scanning")
      expect(end.signals).toEqual(["SIGTERM", "SIGKILL"])
      expect(end.survivors).toEqual([])
      expect(goneAt, "every copy was dead within grace + 1 s of the deadline").toBeDefined()
      expect(goneAt! - u.deadline).toBeLessThan(DEFAULT_GRACE + 1000)
      // and the unit settles (its box released, its launcher reaped) within a second more
      expect(end.settledAt - u.deadline).toBeLessThan(DEFAULT_GRACE + 2000)
      // It did restart during the grace: more than the one copy ran, and none is left.
      expect(recorded(pids).length).toBeGreaterThan(1)
      expect(alive(recorded(pids))).toEqual([])
    })

    it.each(["pipes", "nopipes"])("double-fork daemon (%s) left by a scanner that exits cleanly: the result is staged and the daemon dies with the unit", async (pipes) => {
      const pids = join(dir, `daemon-exit-${pipes}-${level}.pids`)
      const u = supervise(level, node("daemonize"), { deadlineMs: 8000, args: [Unit.adversary("daemonize"), pids, pipes, "exit"] })
      const end = await u.end
      expect(end.kind).toBe("staged")
      if (end.kind !== "staged") return
      expect(end.phase).toBe("staging")
      expect(end.staged).toMatchObject({ kind: "exit", code: 0 })
      expect(end.staged.findings).toEqual([{ detector: "Daemonize", file: "x" }])
      expect(end.settledAt).toBeLessThan(u.deadline)
      expect(recorded(pids)).toHaveLength(3)
      expect(alive(recorded(pids))).toEqual([])
    })

    it("double-fork daemon holding the pipes of a scanner that never exits: all dead within grace + 1 s of the deadline", async () => {
      const pids = join(dir, `daemon-stay-${level}.pids`)
      const u = supervise(level, node("daemonize"), { deadlineMs: DEADLINE, args: [Unit.adversary("daemonize"), pids, "pipes", "stay"] })
      expect(await until(() => recorded(pids).length >= 3, u.deadline), "the daemon was running at the deadline").toBe(true)
      const end = await u.end
      expect(end.kind).toBe("deadline")
      if (end.kind !== "deadline") return
      expect(end.phase).toBe("scanning")
      expect(end.settledAt - u.deadline).toBeLessThan(GRACE + 1000)
      expect(recorded(pids)).toHaveLength(3)
      expect(alive(recorded(pids))).toEqual([])
    })

    it("SIGTERM-ignoring exit trap that starts a cleanup child: killed after the grace, within grace + 1 s", async () => {
      const pids = join(dir, `trap-${level}.pids`)
      const u = supervise(level, node("trap"), { deadlineMs: DEADLINE, graceMs: DEFAULT_GRACE, args: [Unit.adversary("term-trap"), pids] })
      expect(await until(() => recorded(pids).length >= 1, u.deadline), "the scanner was running at its deadline").toBe(true)
      const end = await u.end
      expect(end.kind).toBe("deadline")
      if (end.kind !== "deadline") return
      expect(end.phase).toBe("scanning")
      expect(end.signals).toEqual(["SIGTERM", "SIGKILL"])
      const elapsed = end.settledAt - u.deadline
      expect(elapsed).toBeGreaterThanOrEqual(DEFAULT_GRACE - 20)
      expect(elapsed).toBeLessThan(DEFAULT_GRACE + 1000)
      expect(recorded(pids)).toHaveLength(2)
      expect(alive(recorded(pids))).toEqual([])
    })

    it("a scanner that exits while a grandchild holds its stdout is done: staged with its finding, not a timeout", async () => {
      const pids = join(dir, `hold-${level}.pids`)
      const u = supervise(level, node("hold"), { deadlineMs: 15_000, args: [Unit.adversary("hold-stdout"), pids] })
      const end = await u.end
      expect(end.kind).toBe("staged")
      if (end.kind !== "staged") return
      expect(end.staged).toMatchObject({ kind: "exit", code: 3, findings: [{ detector: "HoldStdout", file: "a.env" }] })
      expect(Scanner.classify(node("hold"), end.staged)).toBe("findings")
      // Settled on the scanner's exit plus the bounded drain, far from the deadline.
      expect(u.deadline - end.settledAt).toBeGreaterThan(10_000)
      expect(recorded(pids)).toHaveLength(2)
      expect(alive(recorded(pids))).toEqual([])
    })

    it("a module runner blocked in cleanup, with a helper that left its session: killed_at_deadline in cleanup, its ctx.log lines kept", async () => {
      const pids = join(dir, `cleanup-${level}.pids`)
      const spec = Scanner.runnerModule({ name: "blocked", module: Unit.adversary("blocked-cleanup"), options: { pidFile: pids } })
      const u = supervise(level, spec, { deadlineMs: DEADLINE })
      expect(await until(() => recorded(pids).length >= 2, u.deadline), "the runner and its helper were running at the deadline").toBe(true)
      const end = await u.end
      expect(end.kind).toBe("deadline")
      if (end.kind !== "deadline") return
      expect(end.phase).toBe("cleanup")
      expect(end.log).toContain("cleanup blocks now")
      expect(end.settledAt - u.deadline).toBeLessThan(GRACE + 1000)
      expect(recorded(pids)).toHaveLength(2)
      expect(alive(recorded(pids))).toEqual([])
    })

    it("permit starvation: a unit waiting for a permit held by a killed unit gets it once that unit is gone; a unit never granted one ends in permit_wait", async () => {
      const permits = Permits.make(1)
      const holder = join(dir, `holder-${level}.pids`)
      const a = supervise(level, node("trap"), { deadlineMs: DEADLINE, permits, args: [Unit.adversary("term-trap"), holder] })
      expect(await until(() => recorded(holder).length >= 1, a.deadline), "the first unit holds the permit").toBe(true)
      const bPids = join(dir, `waiter-${level}.pids`)
      const b = supervise(level, node("hold"), { deadlineMs: DEADLINE + 8000, permits, args: [Unit.adversary("hold-stdout"), bPids] })
      const [ea, eb] = await Promise.all([a.end, b.end])
      expect(ea.kind).toBe("deadline")
      expect(eb.kind).toBe("staged")
      // b could only start once a's box was empty and its permit back.
      expect(eb.settledAt).toBeGreaterThan(ea.settledAt)
      const starved = supervise(level, node("hold"), { deadlineMs: DEADLINE, permits: Permits.make(0), args: [Unit.adversary("hold-stdout"), join(dir, `never-${level}.pids`)] })
      const es = await starved.end
      expect(es.kind).toBe("deadline")
      if (es.kind !== "deadline") return
      expect(es.phase).toBe("permit_wait")
      expect(es.scannerStarted).toBe(false)
      expect(recorded(join(dir, `never-${level}.pids`))).toEqual([])
      expect(alive([...recorded(holder), ...recorded(bPids)])).toEqual([])
    })
  })

  describe.skipIf(!here)(`a device sealing its units with ${level}`, () => {
    it("a restart-on-SIGTERM scanner through a real server: every process of the stage dies within grace + 1 s, the server gets killed_at_deadline in scanning, and the slot claims the next target", async () => {
      const fleet = await Fleet.start({ scanSeconds: 5, slots: 1 })
      const events: Array<Supervisor.DeviceEvent> = []
      const workRoot = mkdtempSync(join(dir, `device-${level}-`))
      let device: Supervisor.Device | null = null
      let watch: ReturnType<typeof setInterval> | undefined
      try {
        await fleet.seed([`acme/restart-a-${level}`, `acme/restart-b-${level}`])
        device = await Supervisor.start({
          server: fleet.url,
          token: fleet.token,
          slots: 1,
          scanner: Scanner.command({ name: "restart", command: process.execPath, args: [Unit.adversary("restart-on-term"), "{workDir}.pids"], exitCodes: { "0": "clean" } }),
          state: join(workRoot, "worker.db"),
          workRoot,
          containment: level,
          childPath: Unit.unitPath,
          pollMs: 50,
          onEvent: (e) => void events.push(e)
        })
        expect(device.containment.level).toBe(level)
        // Watches every stage's pid file: when did the last recorded process of each die?
        const goneAt = new Map<string, number>()
        watch = setInterval(() => {
          for (const f of readdirSync(workRoot).filter((f) => f.endsWith(".pids"))) {
            const pids = recorded(join(workRoot, f))
            if (pids.length > 0 && alive(pids).length === 0) {
              if (!goneAt.has(f)) goneAt.set(f, Date.now())
            } else goneAt.delete(f)
          }
        }, 10)
        const freedAt = async () => {
          for (;;) {
            const e = events.find((e): e is Extract<Supervisor.DeviceEvent, { type: "slot_freed" }> => e.type === "slot_freed")
            if (e) return e
            await new Promise((r) => setTimeout(r, 20))
          }
        }
        const freed = await freedAt()
        expect(freed.end).toBe("deadline")
        // The moment the slot is free, every process the first stage started is already dead.
        const pidFile = readdirSync(workRoot).find((f) => f.startsWith(`scanfleet-r${freed.reservationId}-`) && f.endsWith(".pids"))!
        const pids = recorded(join(workRoot, pidFile))
        expect(pids.length).toBeGreaterThan(1)
        expect(alive(pids)).toEqual([])
        clearInterval(watch)
        expect(goneAt.get(pidFile)! - freed.scanDeadline).toBeLessThan(2000 + 1000)
        expect(await until(() => events.some((e) => e.type === "claimed" && e.reservationId !== freed.reservationId), Date.now() + 15_000), "the slot claimed the next target").toBe(true)
        expect(await until(() => events.some((e) => e.type === "delivered" && e.reservationId === freed.reservationId), Date.now() + 15_000)).toBe(true)
        const a = await fleet.assignment(freed.reservationId)
        expect(a).toMatchObject({ outcome: "killed_at_deadline", finalPhase: "scanning" })
      } finally {
        clearInterval(watch)
        await device?.stop()
        await fleet.close()
      }
    })
  })
}
