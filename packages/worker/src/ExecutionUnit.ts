import { type Source, PhaseModel } from "@scanfleet/core"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import * as Containment from "./Containment.js"
import * as DeviceClock from "./DeviceClock.js"
import { entry } from "./internal/Entries.js"
import type { Permits } from "./Permits.js"
import * as ProcessTree from "./ProcessTree.js"
import type * as Scanner from "./Scanner.js"
import * as UnitProtocol from "./UnitProtocol.js"

/**
 * One assignment's scan stage as a sealed execution unit, and the hard
 * watchdog over it. The unit (permit wait, preparation, acquisition,
 * scanner, filtering, cleanup, staging) is the package's `unit` entry, run
 * inside the device's containment (see `Containment`). At the target-scan
 * deadline the controller sends SIGTERM to every process of the unit but the
 * unit itself (unless the scanner's `stop` is SIGKILL), waits the grace, then
 * empties the whole box with the kernel's help: whatever forked, called
 * setsid or daemonized meanwhile dies too. It settles on the box being
 * empty, never on pipes closing. When the unit stages its result the box is
 * emptied as well, so helpers a clean scanner left behind die with it.
 */

/** What the unit is told to do. */
export interface Job {
  readonly reservationId: number
  readonly target: { readonly id: number; readonly source: Source.Source; readonly identity: string }
  readonly workDir: string
  readonly stageFile: string
  readonly scanner: Scanner.ParsedSpec
  /** The scanner's expanded arguments (command scanners). */
  readonly args: ReadonlyArray<string>
  readonly acquireArgs: ReadonlyArray<string>
  /** Target-scan deadline on the device's clock, for the runner's information. */
  readonly scanDeadline: number
  /** Output limits (default `UnitProtocol.defaultLimits`). */
  readonly limits?: UnitProtocol.OutputLimitsInput
}

/** How a unit ended. `phase` is the last phase the unit reported; `level` the containment it ran under. */
export type End =
  | {
      readonly kind: "staged"
      readonly phase: PhaseModel.Phase
      readonly level: Containment.Level
      readonly staged: Scanner.Staged
      /** The unit's peak resident memory as it reported it from /proc, KiB. */
      readonly unitPeakRssKiB: number | null
      /** Processes the scanner left behind, killed with the unit. */
      readonly leftovers: number
    }
  | { readonly kind: "failed"; readonly phase: PhaseModel.Phase; readonly level: Containment.Level; readonly message: string }
  | {
      readonly kind: "deadline" | "stopped"
      readonly phase: PhaseModel.Phase
      readonly level: Containment.Level
      readonly signals: ReadonlyArray<NodeJS.Signals>
      readonly survivors: ReadonlyArray<number>
      readonly scannerStarted: boolean
      /** The tail of the runner module's `ctx.log` lines, kept though the unit died. */
      readonly log: string
    }

/** Supervision options. */
export interface Options {
  readonly job: Job
  /** The hard deadline, device clock, epoch milliseconds. */
  readonly deadline: number
  /** The device clock the deadline is on, shared with the unit (default: this process's, see `DeviceClock.processClock`). */
  readonly clock?: DeviceClock.DeviceClock
  /** Time between SIGTERM and the kill. */
  readonly graceMs: number
  readonly permits: Permits
  /** The containment to run under (default: detected once per process, see `Containment.detect`). */
  readonly containment?: Containment.Plan
  /** Called once the unit is spawned, before it is told to start: persist the group (and the unit's cgroup, at the cgroup levels) here. */
  readonly onSpawn: (runner: { readonly pid: number; readonly pgid: number; readonly startTime: string | null; readonly cgroup: string | null }) => Promise<void>
  /** Called for each phase the unit enters, in order. */
  readonly onPhase: (phase: PhaseModel.Phase, at: number) => Promise<void>
  /**
   * Called once when the kill begins (deadline or stop), after the last `onPhase` and before any
   * signal: from then on nothing the unit stages is its result, so persist that here. Its failure
   * does not hold up the kill.
   */
  readonly onKill?: () => Promise<void>
  /** Aborting ends the unit at once (the device is shutting down). */
  readonly signal?: AbortSignal
  /** The unit's script (defaults to the package's built `unit` entry). */
  readonly childPath?: string
}

/** The packaged execution-unit script. */
export const defaultChildPath = (): string => entry("unit")

let detected: Promise<Containment.Plan> | null = null
/** The containment a unit runs under when none is given: detected once per process (honouring `SCANFLEET_CONTAINMENT`). */
export const defaultContainment = (): Promise<Containment.Plan> => (detected ??= Effect.runPromise(Containment.detect()))

const LOG_TAIL = 60_000
/** How long the controller waits for the box to empty after the kill before it names survivors. */
const KILL_WAIT_MS = 1000
/** How long an exited unit's channel may stay open (a process it left holds it) before the unit is settled without its last messages. */
const CHANNEL_WAIT_MS = 1000

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms))

/** Runs one unit under its deadline and resolves when it has ended and its box is empty. */
export const run = async (opts: Options): Promise<End> => {
  const plan = opts.containment ?? (await defaultContainment())
  const clock = opts.clock ?? DeviceClock.processClock
  return new Promise<End>((resolve) => {
    const level = plan.level
    const box = Containment.seal(plan)
    const launch = box.launch(process.execPath, opts.childPath ?? defaultChildPath())
    const child = spawn(launch.command, [...launch.args], {
      detached: true,
      stdio: ["ignore", "ignore", "pipe", "ipc"],
      serialization: "json",
      env: { ...process.env, ...launch.env }
    })
    const pid = child.pid
    if (pid === undefined) {
      child.on("error", (e) => resolve({ kind: "failed", phase: "assigned", level, message: `could not start the execution unit: ${e.message}` }))
      return
    }
    box.launched(pid)
    let phase: PhaseModel.Phase = "assigned"
    let chain: Promise<void> = Promise.resolve()
    let ending = false
    let scannerStarted = false
    let failure: string | null = null
    let journalError: string | null = null
    let staged = false
    let peakRss: number | null = null
    let release: (() => void) | null = null
    let stderr = ""
    let moduleLog = ""
    let ready = false
    let persisted = false
    const permitAbort = new AbortController()
    let exited!: () => void
    const exit = new Promise<void>((r) => (exited = r))
    let exitInfo = ""
    let spawnPersisted: Promise<void> = Promise.resolve()

    child.stderr?.setEncoding("utf8")
    child.stderr?.on("data", (d: string) => {
      stderr = (stderr + d).slice(-4000)
    })
    child.on("exit", (code, sig) => {
      exitInfo = sig ? `signal ${sig}` : `exit code ${code}`
      exited()
    })
    // The unit's last messages ("staged") may still be unread in the channel when its exit is
    // seen (on a busy machine they often are), and settling disconnects the channel, dropping
    // them: the unit then looked as if it had ended without a result. They are all delivered
    // before the channel closes, so an exit waits for that first.
    let channelClosed!: () => void
    const closed = new Promise<void>((r) => (channelClosed = r))
    child.on("disconnect", () => channelClosed())
    child.on("error", () => {})

    const send = (msg: UnitProtocol.ToUnit) => {
      if (child.connected) child.send(UnitProtocol.ToUnit.parse(msg))
    }

    const finish = async (end: () => Promise<End>) => {
      if (ending) return
      ending = true
      clearTimeout(timer)
      opts.signal?.removeEventListener("abort", onStop)
      permitAbort.abort()
      const out = await end()
      release?.()
      await chain
      if (child.connected) child.disconnect()
      // Our end of the unit's stderr goes too, even if something still holds the other end.
      child.stderr?.destroy()
      // The launcher is our child: its exit is reaped here, briefly waited for.
      await Promise.race([exit, sleep(200)])
      resolve(out)
    }

    /** Everything in the box but the unit and its launcher. */
    const scannerSide = () => box.members().filter((p) => p !== pid && p !== box.unitPid())

    const kill = (kind: "deadline" | "stopped") =>
      finish(async () => {
        const at = phase
        // No phase is journaled after this (messages are ignored once ending) and the runner is persisted,
        // so the callback sees the record settled.
        await Promise.all([chain, spawnPersisted])
        await opts.onKill?.().catch(() => {})
        const signals: Array<NodeJS.Signals> = []
        if (opts.job.scanner.stop === "SIGTERM" && ready && box.signalOthers("SIGTERM") > 0) {
          signals.push("SIGTERM")
          // A duration, so the monotonic clock: a wall-clock step back during the grace must not stretch it.
          const until = DeviceClock.monotonicMs() + opts.graceMs
          // Each look reads /proc; looking every 50 ms leaves the event loop to the other slots' units.
          while (DeviceClock.monotonicMs() < until && scannerSide().length > 0) await sleep(Math.min(50, Math.max(0, until - DeviceClock.monotonicMs())))
        }
        const before = box.members().length
        const survivors = await box.kill(KILL_WAIT_MS)
        if (before > 0) signals.push("SIGKILL")
        await box.release()
        return { kind, phase: at, level, signals, survivors, scannerStarted, log: moduleLog }
      })

    const settleNormally = () =>
      finish(async () => {
        // The unit is done; whatever it left behind in its box goes too.
        await Promise.race([exit, sleep(500)])
        const leftovers = scannerSide().length
        await box.kill(KILL_WAIT_MS)
        await box.release()
        await chain
        if (journalError !== null) return { kind: "failed", phase, level, message: `the phase journal could not be written: ${journalError}` }
        if (staged) {
          let doc: UnitProtocol.StageFile
          try {
            doc = await UnitProtocol.readStaged(opts.job.stageFile, UnitProtocol.OutputLimitsSchema.parse(opts.job.limits ?? {}))
          } catch (e) {
            return { kind: "failed", phase, level, message: `the staged result could not be read: ${(e as Error).message}` }
          }
          // Staged as the deadline passed, before its timer ran here: the deadline ended the stage all the same.
          if (!UnitProtocol.stagedInTime(doc, opts.deadline))
            return { kind: "deadline", phase, level, signals: leftovers > 0 ? ["SIGKILL"] : [], survivors: [], scannerStarted, log: moduleLog }
          return { kind: "staged", phase, level, staged: doc.staged, unitPeakRssKiB: peakRss, leftovers }
        }
        const why = failure ?? `the execution unit ended (${exitInfo}) without staging a result${stderr ? `: ${stderr.trim()}` : ""}`
        return { kind: "failed", phase, level, message: why }
      })

    const startIfReady = () => {
      if (ending || !ready || !persisted) return
      send({ t: "start", job: { ...opts.job, args: [...opts.job.args], acquireArgs: [...opts.job.acquireArgs], limits: opts.job.limits ?? {}, clockAnchorMs: clock.anchorMs } })
    }

    child.on("message", (raw) => {
      if (ending) return
      const parsed = UnitProtocol.ToController.safeParse(raw)
      if (!parsed.success) return
      const msg = parsed.data
      switch (msg.t) {
        case "ready": {
          // Inside a PID namespace the unit is the launcher's child; otherwise it is the launcher.
          const s = ProcessTree.stat(msg.hostPid)
          const ok = msg.hostPid === pid || (level === "pid-namespace" && s !== null && s.ppid === pid)
          if (!ok) {
            void finish(async () => {
              await box.kill(KILL_WAIT_MS)
              await box.release()
              return { kind: "failed", phase, level, message: `the execution unit reported pid ${msg.hostPid}, which is not the process started` }
            })
            return
          }
          try {
            box.attach({ unitPid: msg.hostPid, launcherPid: pid })
          } catch (e) {
            void finish(async () => {
              await box.kill(KILL_WAIT_MS)
              await box.release()
              return { kind: "failed", phase, level, message: `could not contain the execution unit (${level}): ${(e as Error).message}` }
            })
            return
          }
          ready = true
          startIfReady()
          return
        }
        case "phase": {
          // Only forward moves inside the scan stage reach the journal.
          if (!PhaseModel.canTransition(phase, msg.phase)) return
          phase = msg.phase
          const p = msg.phase
          // A journal write that fails must not wedge the unit's supervision: the error is kept and reported.
          chain = chain.then(() => opts.onPhase(p, Math.round(msg.at))).catch((e: unknown) => {
            journalError ??= (e as Error).message ?? String(e)
          })
          return
        }
        case "permit_request":
          opts.permits.acquire(permitAbort.signal).then(
            (rel) => {
              if (ending) return rel()
              release = rel
              send({ t: "permit" })
            },
            () => {}
          )
          return
        case "scanner":
          scannerStarted = true
          return
        case "log":
          moduleLog = (moduleLog + msg.text).slice(-LOG_TAIL)
          return
        case "staged":
          staged = true
          peakRss = msg.peakRssKiB
          void settleNormally()
          return
        case "failed":
          failure = msg.message
          return
      }
    })
    void exit
      .then(() => (ending ? undefined : Promise.race([closed, sleep(CHANNEL_WAIT_MS)])))
      .then(() => {
        if (!ending) void settleNormally()
      })

    const onStop = () => void kill("stopped")
    opts.signal?.addEventListener("abort", onStop, { once: true })
    const timer = setTimeout(() => void kill("deadline"), Math.max(0, opts.deadline - clock.now()))

    const runner = { pid, pgid: pid, startTime: ProcessTree.startTime(pid), cgroup: box.cgroup }
    const spawning = opts.onSpawn(runner)
    spawnPersisted = spawning.catch(() => {})
    spawning.then(
      () => {
        persisted = true
        startIfReady()
        if (opts.signal?.aborted) onStop()
      },
      (e) =>
        void finish(async () => {
          await box.kill(KILL_WAIT_MS)
          await box.release()
          return { kind: "failed", phase, level, message: `could not persist the runner: ${(e as Error).message}` }
        })
    )
  })
}

/**
 * The same as an Effect: interrupting it ends the unit as a device stop
 * would (its box is emptied before the interruption completes).
 */
export const supervise = (opts: Omit<Options, "signal">): Effect.Effect<End> =>
  Effect.async<End>((resume) => {
    const stop = new AbortController()
    const end = run({ ...opts, signal: stop.signal })
    void end.then((e) => resume(Effect.succeed(e)))
    return Effect.promise(() => {
      stop.abort()
      return end
    })
  })
