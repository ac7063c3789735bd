/**
 * The execution unit of one assignment's scan stage. The controller starts
 * it inside the device's containment (a PID namespace, a cgroup, or a
 * session of its own) and talks to it over the IPC channel, every message
 * parsed with `UnitProtocol`: the unit says it is ready, reports each phase
 * it enters, asks for a scan permit, runs the scanner and stages the result
 * in a file. The controller's watchdog alone decides when the unit must die;
 * the unit never looks at a clock.
 */
import { PhaseModel } from "@scanfleet/core"
import { spawn } from "node:child_process"
import { readFileSync, readlinkSync } from "node:fs"
import { mkdir, open, rename, rm, writeFile } from "node:fs/promises"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import * as Containment from "../Containment.js"
import * as DeviceClock from "../DeviceClock.js"
import * as Scanner from "../Scanner.js"
import * as UnitProtocol from "../UnitProtocol.js"
import * as Output from "./Output.js"

type ScanPhase = (typeof PhaseModel.scanStage)[number]

const send = (msg: UnitProtocol.ToController): Promise<void> =>
  new Promise((resolve) => {
    if (!process.connected || !process.send) return resolve()
    process.send(UnitProtocol.ToController.parse(msg), undefined, {}, () => resolve())
  })

// The controller's device clock (it compares these times with the deadline), once the job names its anchor.
let clock: DeviceClock.DeviceClock = DeviceClock.processClock
let current = -1
const enter = (phase: ScanPhase) => {
  const i = PhaseModel.scanStage.indexOf(phase)
  if (i <= current) return
  current = i
  void send({ t: "phase", phase, at: clock.now() })
}

// The controller is gone (crashed or killed): the unit empties its box, itself included, rather than leave orphans.
process.on("disconnect", () => void Containment.killFromInside())

let permitGranted!: () => void
const permit = new Promise<void>((resolve) => (permitGranted = resolve))

process.on("message", (raw) => {
  const msg = UnitProtocol.ToUnit.safeParse(raw)
  if (!msg.success) return
  if (msg.data.t === "permit") permitGranted()
  else void run(msg.data.job)
})

/** The unit's peak resident memory, from /proc (null elsewhere). */
const peakRssKiB = (): number | null => {
  try {
    const m = /VmHWM:\s+(\d+)/.exec(readFileSync("/proc/self/status", "utf8"))
    return m ? Number(m[1]) : null
  } catch {
    return null
  }
}

/** This process's pid as the controller sees it: through the host's /proc when inside a PID namespace. */
const hostPid = (): number => {
  try {
    const n = Number(readlinkSync("/proc/self"))
    return Number.isInteger(n) && n > 0 ? n : process.pid
  } catch {
    return process.pid
  }
}

interface Exit {
  readonly code: number | null
  readonly signal: string | null
  readonly error: string | null
}

/**
 * Runs one command and settles when it exits, not when its pipes close: a
 * grandchild holding stdout open gets `drainMs` to let go, then the pipes are
 * cut (the grandchild dies with the unit's box).
 */
const runProcess = (
  command: string,
  args: ReadonlyArray<string>,
  opts: { readonly cwd: string; readonly env: Record<string, string> | undefined; readonly drainMs: number },
  onStdout: (chunk: Buffer) => void,
  onStderr: (chunk: Buffer) => void,
  onStart?: (pid: number | undefined) => void
): Promise<Exit> =>
  new Promise((resolve) => {
    const child = spawn(command, [...args], { cwd: opts.cwd, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...opts.env } })
    onStart?.(child.pid)
    child.stdout.on("data", onStdout)
    child.stderr.on("data", onStderr)
    const closed = Promise.all([new Promise((r) => child.stdout.once("close", r)), new Promise((r) => child.stderr.once("close", r))])
    let settled = false
    child.once("error", (e) => {
      if (settled) return
      settled = true
      resolve({ code: null, signal: null, error: `could not start ${command}: ${e.message}` })
    })
    child.once("exit", (code, signal) => {
      void Promise.race([closed, new Promise((r) => setTimeout(r, opts.drainMs))]).then(() => {
        child.stdout.destroy()
        child.stderr.destroy()
        if (settled) return
        settled = true
        resolve({ code, signal, error: null })
      })
    })
  })

const runCommand = async (job: UnitProtocol.Job, spec: Extract<Scanner.ParsedSpec, { kind: "command" }>): Promise<Scanner.Staged> => {
  const limits = job.limits
  const log = Output.log(limits.maxLogChars)
  const toLog = (chunk: Buffer) => log.append(chunk.toString("utf8"))
  const procOpts = { cwd: job.workDir, env: spec.env, drainMs: limits.drainMs }
  if (spec.acquire) {
    enter("acquiring")
    const acq = await runProcess(spec.acquire.command, job.acquireArgs, procOpts, toLog, toLog)
    if (acq.error !== null || acq.code !== 0) {
      const why = acq.error ?? `acquisition failed with exit ${acq.code ?? acq.signal}`
      return { kind: "outcome", outcome: "scan_error", findings: [], log: log.text(`\n${why}`) }
    }
  }
  enter("scanning")
  const out = Output.collector(limits, join(job.workDir, "scanner.stdout"))
  const done = await runProcess(spec.command, job.args, procOpts, out.write, toLog, (pid) => void send({ t: "scanner", ...(pid !== undefined ? { pid } : {}) }))
  out.end()
  enter("filtering")
  if (done.error !== null) return { kind: "outcome", outcome: "scan_error", findings: [], log: log.text(`\n${done.error}`) }
  const cut = out.cut()
  const text = log.text(Output.describeCut(cut, limits, out.malformed()))
  enter("cleanup")
  // A helper the scanner left (a daemon still writing here) can keep the folder from emptying. That
  // costs nothing: the controller removes the folder once the box is empty, so the result stands.
  await rm(job.workDir, { recursive: true, force: true }).catch(() => {})
  return { kind: "exit", code: done.code, signal: done.signal, findings: [...out.findings()], malformed: out.malformed(), log: text, cut: { ...cut, logChars: log.dropped() } }
}

const runModule = async (job: UnitProtocol.Job, spec: Extract<Scanner.ParsedSpec, { kind: "module" }>): Promise<Scanner.Staged> => {
  const limits = job.limits
  const log = Output.log(limits.maxLogChars)
  const mod = (await import(pathToFileURL(spec.module).href)) as Record<string, unknown>
  const fn = mod[spec.exportName]
  if (typeof fn !== "function") throw new Error(`module ${spec.module} exports no function named ${spec.exportName}`)
  const ctx: Scanner.RunnerContext = {
    target: job.target,
    workDir: job.workDir,
    scanDeadline: job.scanDeadline,
    options: spec.options,
    enter,
    log: (line) => {
      log.append(`${line}\n`)
      void send({ t: "log", text: `${line}\n`.slice(0, 4096) })
    }
  }
  const out = (await (fn as Scanner.RunnerFunction)(ctx)) as Partial<Scanner.RunnerResult> | undefined
  const outcome = (Scanner.scannerOutcomes as ReadonlyArray<unknown>).includes(out?.outcome) ? (out!.outcome as Scanner.ScannerOutcome) : "scan_error"
  const collected = Output.collector(limits, null)
  for (const f of Array.isArray(out?.findings) ? out.findings : []) if (f !== null && typeof f === "object" && !Array.isArray(f)) collected.offer(f)
  if (typeof out?.log === "string") log.append(out.log)
  const cut = collected.cut()
  const text = log.text(Output.describeCut(cut, limits, 0))
  return { kind: "outcome", outcome, findings: [...collected.findings()], log: text, cut: { ...cut, logChars: log.dropped() } }
}

const run = async (raw: UnitProtocol.Job) => {
  try {
    const job = UnitProtocol.JobSchema.parse(raw)
    if (job.clockAnchorMs !== undefined) clock = DeviceClock.fromAnchor(job.clockAnchorMs)
    enter("permit_wait")
    await send({ t: "permit_request" })
    await permit
    enter("preparing")
    await mkdir(job.workDir, { recursive: true })
    const spec = job.scanner
    const staged = spec.kind === "command" ? await runCommand(job, spec) : await runModule(job, spec)
    enter("staging")
    const tmp = `${job.stageFile}.tmp`
    const stagedAt = clock.now()
    await writeFile(tmp, JSON.stringify({ stagedAt, staged } satisfies UnitProtocol.StageFile))
    const fh = await open(tmp, "r")
    await fh.sync()
    await fh.close()
    await rename(tmp, job.stageFile)
    await send({ t: "staged", at: stagedAt, peakRssKiB: peakRssKiB() })
    process.exit(0)
  } catch (e) {
    await send({ t: "failed", message: String(e instanceof Error && e.stack ? e.stack : e).slice(0, 4000), at: clock.now() })
    process.exit(1)
  }
}

void send({ t: "ready", hostPid: hostPid() })
