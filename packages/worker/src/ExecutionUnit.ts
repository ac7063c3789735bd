import { PhaseModel } from "@scanfleet/core"
import { fork } from "node:child_process"
import { readFile } from "node:fs/promises"
import { fileURLToPath } from "node:url"
import { z } from "zod"
import type { Permits } from "./Permits.js"
import * as ProcessTree from "./ProcessTree.js"
import * as Scanner from "./Scanner.js"

/**
 * One assignment's scan stage as a supervised child process group, and the
 * hard watchdog over it. The unit (permit wait, preparation, acquisition,
 * scanner, filtering, cleanup, staging) runs in `runtime/child.mjs`, started
 * detached so it leads its own process group. At the target-scan deadline the
 * controller signals the whole group (SIGTERM, then SIGKILL after the grace;
 * SIGKILL at once for scanners that restart on SIGTERM) and settles on the
 * unit's exit and the group's emptiness, never on its pipes closing: a
 * grandchild holding an inherited pipe cannot keep a slot busy.
 */

/** What the unit is told to do. */
export interface Job {
  readonly reservationId: number
  readonly target: { readonly id: number; readonly source: string; readonly identity: string }
  readonly workDir: string
  readonly stageFile: string
  readonly scanner: Scanner.ParsedSpec
  /** The scanner's expanded arguments (command scanners). */
  readonly args: ReadonlyArray<string>
  readonly acquireArgs: ReadonlyArray<string>
  /** Target-scan deadline on the device's clock, for the runner's information. */
  readonly scanDeadline: number
}

/** How a unit ended. `phase` is the last phase the unit reported. */
export type End =
  | { readonly kind: "staged"; readonly phase: PhaseModel.Phase; readonly staged: Scanner.Staged }
  | { readonly kind: "failed"; readonly phase: PhaseModel.Phase; readonly message: string }
  | {
      readonly kind: "deadline" | "stopped"
      readonly phase: PhaseModel.Phase
      readonly signals: ReadonlyArray<NodeJS.Signals>
      readonly survivors: ReadonlyArray<number>
      readonly scannerStarted: boolean
    }

/** Supervision options. */
export interface Options {
  readonly job: Job
  /** The hard deadline, device clock, epoch milliseconds. */
  readonly deadline: number
  /** Time between SIGTERM and SIGKILL. */
  readonly graceMs: number
  readonly permits: Permits
  /** Called once the unit is spawned, before it is told to start: persist the group here. */
  readonly onSpawn: (runner: { readonly pid: number; readonly pgid: number; readonly startTime: string | null }) => Promise<void>
  /** Called for each phase the unit enters, in order. */
  readonly onPhase: (phase: PhaseModel.Phase, at: number) => Promise<void>
  /** Aborting ends the unit at once (the device is shutting down). */
  readonly signal?: AbortSignal
  /** The unit's script (defaults to the packaged `runtime/child.mjs`). */
  readonly childPath?: string
}

/** The packaged execution-unit script. */
export const defaultChildPath = (): string => fileURLToPath(new URL("../runtime/child.mjs", import.meta.url))

const Message = z.discriminatedUnion("t", [
  z.object({ t: z.literal("phase"), phase: z.enum(PhaseModel.scanStage), at: z.number() }),
  z.object({ t: z.literal("permit_request") }),
  z.object({ t: z.literal("scanner"), pid: z.number().optional() }),
  z.object({ t: z.literal("staged"), at: z.number() }),
  z.object({ t: z.literal("failed"), message: z.string(), at: z.number() })
])

/** Runs one unit under its deadline and resolves when it has ended and its group is empty. */
export const run = (opts: Options): Promise<End> =>
  new Promise<End>((resolve) => {
    const child = fork(opts.childPath ?? defaultChildPath(), [], {
      detached: true,
      // A plain Node: the controller's own flags (loaders, inspectors) are not the unit's business.
      execArgv: [],
      stdio: ["ignore", "ignore", "pipe", "ipc"],
      serialization: "json"
    })
    const pid = child.pid
    if (pid === undefined) {
      child.on("error", (e) => resolve({ kind: "failed", phase: "assigned", message: `could not start the execution unit: ${e.message}` }))
      return
    }
    const pgid = pid
    let phase: PhaseModel.Phase = "assigned"
    let chain: Promise<void> = Promise.resolve()
    let ending = false
    let scannerStarted = false
    let failure: string | null = null
    let journalError: string | null = null
    let staged = false
    let release: (() => void) | null = null
    let stderr = ""
    const permitAbort = new AbortController()
    let exited!: () => void
    const exit = new Promise<void>((r) => (exited = r))
    let exitInfo = ""

    child.stderr?.setEncoding("utf8")
    child.stderr?.on("data", (d: string) => {
      stderr = (stderr + d).slice(-4000)
    })
    child.on("exit", (code, sig) => {
      exitInfo = sig ? `signal ${sig}` : `exit code ${code}`
      exited()
    })
    child.on("error", () => {})

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
      resolve(out)
    }

    const kill = (kind: "deadline" | "stopped") =>
      finish(async () => {
        const at = phase
        const r = await ProcessTree.terminateTree(pgid, { graceMs: opts.graceMs, sigterm: opts.job.scanner.stop === "SIGTERM" })
        return { kind, phase: at, signals: r.signals, survivors: r.survivors, scannerStarted }
      })

    const settleNormally = () =>
      finish(async () => {
        // The unit is done; whatever it left behind in its group goes too.
        await Promise.race([exit, new Promise((r) => setTimeout(r, 500))])
        await ProcessTree.terminateTree(pgid, { graceMs: 0, sigterm: false })
        await chain
        if (journalError !== null) return { kind: "failed", phase, message: `the phase journal could not be written: ${journalError}` }
        if (staged) {
          try {
            const doc = Scanner.StagedSchema.parse(JSON.parse(await readFile(opts.job.stageFile, "utf8")))
            return { kind: "staged", phase, staged: doc }
          } catch (e) {
            return { kind: "failed", phase, message: `the staged result could not be read: ${(e as Error).message}` }
          }
        }
        const why = failure ?? `the execution unit ended (${exitInfo}) without staging a result${stderr ? `: ${stderr.trim()}` : ""}`
        return { kind: "failed", phase, message: why }
      })

    child.on("message", (raw) => {
      if (ending) return
      const parsed = Message.safeParse(raw)
      if (!parsed.success) return
      const msg = parsed.data
      switch (msg.t) {
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
              child.send({ t: "permit" })
            },
            () => {}
          )
          return
        case "scanner":
          scannerStarted = true
          return
        case "staged":
          staged = true
          void settleNormally()
          return
        case "failed":
          failure = msg.message
          return
      }
    })
    void exit.then(() => {
      if (!ending) void settleNormally()
    })

    const onStop = () => void kill("stopped")
    opts.signal?.addEventListener("abort", onStop, { once: true })
    const timer = setTimeout(() => void kill("deadline"), Math.max(0, opts.deadline - Date.now()))

    const runner = { pid, pgid, startTime: ProcessTree.startTime(pid) }
    opts.onSpawn(runner).then(
      () => {
        if (!ending && child.connected) child.send({ t: "start", job: opts.job })
        if (opts.signal?.aborted) onStop()
      },
      (e) => void finish(async () => {
        await ProcessTree.terminate(pgid, { graceMs: 0, sigterm: false })
        return { kind: "failed", phase, message: `could not persist the runner: ${(e as Error).message}` }
      })
    )
  })
