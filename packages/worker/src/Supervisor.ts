import { Deadline, PhaseModel, WorkerApi } from "@scanfleet/core"
import { existsSync } from "node:fs"
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Data } from "effect"
import type { z } from "zod"
import * as Client from "./Client.js"
import * as ExecutionUnit from "./ExecutionUnit.js"
import * as LocalState from "./LocalState.js"
import * as Outbox from "./Outbox.js"
import * as Permits from "./Permits.js"
import * as ProcessTree from "./ProcessTree.js"
import * as Redaction from "./Redaction.js"
import * as Scanner from "./Scanner.js"

/**
 * The device controller: it claims assignments for its slots, runs each scan
 * stage as a supervised execution unit under the hard target-scan deadline,
 * journals every phase before acting on it, hands events and results to the
 * outbox, and on start recovers whatever a previous run left behind.
 */

/** Something the controller did, for logs, tests and benchmarks. */
export type DeviceEvent =
  | { readonly type: "claimed"; readonly slot: number; readonly reservationId: number; readonly at: number }
  | {
      readonly type: "slot_freed"
      readonly slot: number
      readonly reservationId: number
      readonly at: number
      readonly end: ExecutionUnit.End["kind"]
      /** The local target-scan deadline of the assignment. */
      readonly scanDeadline: number
    }
  | { readonly type: "recovered"; readonly reservationId: number; readonly phase: PhaseModel.Phase | null; readonly killed: ReadonlyArray<number> }
  | { readonly type: "delivered"; readonly reservationId: number; readonly delivered: Outbox.Delivered }
  | { readonly type: "retry"; readonly reservationId: number; readonly message: string }
  | { readonly type: "error"; readonly message: string }

/** Device options. */
export interface Options {
  /** Worker API base URL. */
  readonly server: string
  /** The device's bearer token. */
  readonly token: string
  /** Number of slots (concurrent assignments). */
  readonly slots: number
  /** The scanner plug-in. */
  readonly scanner: Scanner.ParsedSpec
  /** Path of the SQLite state file. */
  readonly state: string
  /** Scan permits: how many scanners may run at once (default: one per slot). */
  readonly permits?: number
  /** SIGTERM → SIGKILL grace at the deadline, milliseconds (default 2000). */
  readonly graceMs?: number
  /** Wait between claims when nothing is pending, milliseconds (default 1000). */
  readonly pollMs?: number
  /** Where work directories are created (default the OS temp dir). */
  readonly workRoot?: string
  /** Time a clean shutdown waits for the outbox, milliseconds (default 3000). */
  readonly drainMs?: number
  /** Outbox backoff bounds, milliseconds. */
  readonly minBackoffMs?: number
  readonly maxBackoffMs?: number
  /** Receives every device event (default: JSON lines on stderr for errors and retries only). */
  readonly onEvent?: (e: DeviceEvent) => void
  /** The fleet key (hex) to fingerprint secrets with; fetched from the server when absent. */
  readonly fleetKey?: string
  /** Also upload secret values in the clear, for a server with a raw-upload key (opt-in; default false). */
  readonly rawUpload?: boolean
  /** Overrides the execution-unit script (tests). */
  readonly childPath?: string
}

/** A running device. */
export interface Device {
  readonly state: LocalState.LocalState
  /** Stops claiming, ends running units (their groups are killed), flushes the outbox for a while and closes the state. */
  readonly stop: () => Promise<void>
}

const LOG_MAX = 60_000

/** Builds a result body within the contract's bounds, saying in the log what was cut. */
const resultBody = (
  fence: number,
  outcome: WorkerApi.AssignmentView["outcome"] & string,
  finalPhase: PhaseModel.Phase | null,
  findings: ReadonlyArray<Record<string, unknown>>,
  log: string
): z.infer<typeof WorkerApi.ResultRequest> => {
  let kept = findings.slice(0, 10_000)
  let note = kept.length < findings.length ? `\n[${findings.length - kept.length} findings cut at the 10,000 limit]` : ""
  const budget = WorkerApi.maxResultBytes - 70_000
  while (kept.length > 0 && Buffer.byteLength(JSON.stringify(kept)) > budget) {
    const half = Math.floor(kept.length / 2)
    note = `\n[findings cut to ${half} of ${findings.length} to fit the result size limit]`
    kept = kept.slice(0, half)
  }
  let text = log + note
  if (text.length > LOG_MAX) text = text.slice(text.length - LOG_MAX)
  return { fence, outcome, finalPhase, findings: kept as Array<Record<string, unknown>>, log: text }
}

const clockIso = (ms: number) => new Date(ms).toISOString()

/** Another controller runs on the same state file; starting a second one would kill its scans. */
export class StateInUse extends Data.TaggedError("StateInUse")<{ readonly file: string; readonly pid: number; readonly message: string }> {}

/**
 * Takes the state file's lock: a file naming this process (pid and start
 * time). A lock whose process is gone, or whose pid now belongs to another
 * process, is stale (the previous controller crashed) and is taken over.
 */
const lock = async (file: string): Promise<() => Promise<void>> => {
  const me = JSON.stringify({ pid: process.pid, startTime: ProcessTree.startTime(process.pid) })
  for (let attempt = 0; ; attempt++) {
    try {
      // Exclusive create: of two controllers starting at once, one wins.
      await writeFile(file, me, { flag: "wx" })
      return async () => {
        await rm(file, { force: true })
      }
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e
    }
    let holder = 0
    try {
      let text = await readFile(file, "utf8")
      // A lock being written this very moment reads empty; give its writer a moment.
      if (text === "") text = await new Promise<void>((r) => setTimeout(r, 100)).then(() => readFile(file, "utf8"))
      const held = JSON.parse(text) as { pid?: unknown; startTime?: unknown }
      const pid = typeof held.pid === "number" && held.pid > 0 ? held.pid : 0
      const now = pid > 0 ? ProcessTree.stat(pid) : null
      if (now !== null && now.state !== "Z" && (held.startTime === null || now.startTime === held.startTime)) holder = pid
    } catch {
      // An unreadable lock names nobody.
    }
    if (holder > 0 || attempt > 0)
      throw new StateInUse({ file, pid: holder, message: `the state file is in use by a running controller${holder > 0 ? ` (pid ${holder})` : ""}; stop it first` })
    await rm(file, { force: true })
  }
}

/**
 * Starts a device: recovery first, then one claim loop per slot.
 *
 * @example
 * const device = await Supervisor.start({
 *   server: "http://127.0.0.1:8080", token, slots: 2, state: "./worker.db", scanner: Scanner.demo()
 * })
 * process.on("SIGTERM", () => void device.stop())
 */
export const start = async (opts: Options): Promise<Device> => {
  const emit = opts.onEvent ?? ((e: DeviceEvent) => {
    if (e.type === "error" || e.type === "retry") process.stderr.write(`${JSON.stringify({ at: new Date().toISOString(), ...e })}\n`)
  })
  const unlock = await lock(`${opts.state}.lock`)
  const state = await LocalState.open(opts.state).catch(async (e) => {
    await unlock()
    throw e
  })
  const client = Client.make({ server: opts.server, token: opts.token })
  const redactor = Redaction.make({ server: opts.server, token: opts.token, scanner: opts.scanner, fleetKey: opts.fleetKey, rawUpload: opts.rawUpload })
  const permits = Permits.make(opts.permits ?? opts.slots)
  const graceMs = opts.graceMs ?? 2000
  const pollMs = opts.pollMs ?? 1000
  const workRoot = opts.workRoot ?? tmpdir()
  const stageDir = `${opts.state}.stage`
  await mkdir(stageDir, { recursive: true })
  const stopUnits = new AbortController()
  let stopping = false
  let wakeSleepers: Array<() => void> = []

  const sleep = (ms: number) =>
    new Promise<void>((r) => {
      const t = setTimeout(done, ms)
      function done() {
        clearTimeout(t)
        wakeSleepers = wakeSleepers.filter((w) => w !== done)
        r()
      }
      wakeSleepers.push(done)
    })

  const mustGet = async (id: number) => {
    const a = await state.assignment(id)
    if (a === null) throw new Error(`assignment ${id} vanished from the local state`)
    return a
  }

  const onResult = async (id: number, d: Outbox.Delivered) => {
    const a = await mustGet(id)
    const terminal = a.phase !== null && PhaseModel.isTerminal(a.phase)
    if (!terminal) {
      // The server closed the reservation with the result, so this last event stays local.
      if (d.kind === "accepted") await state.append(id, { kind: "phase", phase: "completed", at: Date.now(), detail: `receipt ${d.receipt.receiptId}` }, "local")
      else await state.append(id, { kind: "phase", phase: "failed", at: Date.now(), detail: d.kind === "released" ? "released" : d.message }, "local")
    }
    const after = await mustGet(id)
    await state.putAssignment({
      ...after,
      status: "done",
      receipt: d.kind === "accepted" ? d.receipt : after.receipt,
      note: d.kind === "accepted" ? after.note : d.kind === "released" ? "released: the target went back to the queue" : d.message
    })
    emit({ type: "delivered", reservationId: id, delivered: d })
  }

  // Started once recovery has settled every record, so the two never write the same row at once.
  let sender: Outbox.Outbox | null = null
  const outbox = { notify: () => sender?.notify() }
  const startOutbox = () =>
    (sender = Outbox.start({
      state,
      client,
      ...(opts.minBackoffMs !== undefined ? { minBackoffMs: opts.minBackoffMs } : {}),
      ...(opts.maxBackoffMs !== undefined ? { maxBackoffMs: opts.maxBackoffMs } : {}),
      onResult,
      onRetry: (reservationId, message) => emit({ type: "retry", reservationId, message })
    }))

  const append = async (id: number, phase: PhaseModel.Phase, detail?: string, kind: "phase" | "recovered" = "phase") => {
    const e = await state.append(id, { kind, phase, at: Date.now(), ...(detail !== undefined ? { detail } : {}) })
    outbox.notify()
    return e
  }

  /** Ends an assignment whose scan stage stopped early: a terminal event, then the result. */
  const finishEarly = async (
    id: number,
    terminal: "timed_out" | "failed",
    outcome: "killed_at_deadline" | "scan_error",
    finalPhase: PhaseModel.Phase | null,
    log: string
  ) => {
    const e = await append(id, terminal, log.slice(0, 1000))
    const a = await mustGet(id)
    // The record first: once the result is queued, the outbox may finish the assignment at any moment.
    await state.putAssignment({ ...a, status: "delivering", outcome, finalPhase })
    await state.putResult({ reservationId: id, afterSeq: e.seq, body: resultBody(a.fence, outcome, finalPhase, [], log) })
    outbox.notify()
  }

  /** Ends an assignment the device gives up on while the fleet can still use it: a terminal event, then a release. */
  const finishReleased = async (id: number, finalPhase: PhaseModel.Phase, detail: string) => {
    const e = await append(id, "failed", detail.slice(0, 1000))
    const a = await mustGet(id)
    await state.putAssignment({ ...a, status: "delivering", finalPhase })
    await state.putResult({ reservationId: id, afterSeq: e.seq, kind: "release", body: { fence: a.fence } })
    outbox.notify()
  }

  /** Runs the upload stage's local part: bundle the result, queue it, and wait for the receipt. */
  const finishThroughUpload = async (id: number, outcome: Exclude<z.infer<typeof WorkerApi.Receipt>["outcome"], "killed_at_deadline">, finalPhase: PhaseModel.Phase | null, staged: { findings: ReadonlyArray<Record<string, unknown>>; log: string }) => {
    const started = await mustGet(id)
    if (started.phase === null || PhaseModel.canTransition(started.phase, "bundling")) await append(id, "bundling")
    const a = await mustGet(id)
    // Redaction: no declared secret value leaves the device (nor reaches the local result queue).
    const body = resultBody(a.fence, outcome, finalPhase, await redactor.findings(staged.findings), staged.log)
    if (a.phase !== "uploading" && a.phase !== "awaiting_receipt") await append(id, "uploading")
    const cur = await mustGet(id)
    const waiting = cur.phase === "awaiting_receipt" ? cur.lastSeq : (await append(id, "awaiting_receipt")).seq
    await state.putAssignment({ ...(await mustGet(id)), status: "delivering", outcome, finalPhase })
    await state.putResult({ reservationId: id, afterSeq: waiting, body })
    if (a.stageFile) await rm(a.stageFile, { force: true })
    outbox.notify()
  }

  const spec = opts.scanner

  const execute = async (slot: number, view: WorkerApi.AssignmentView, askedAt: number) => {
    const id = view.reservationId
    const now = Date.now()
    // Measured from when the claim was sent, the offset errs early: the device
    // stops by the server's deadline even with the request's latency unknown.
    const offset = askedAt - view.serverNow
    const deadlines = {
      scan: view.deadlines.targetScan.at + offset,
      upload: view.deadlines.resultUpload.at + offset,
      expiry: view.deadlines.assignmentExpiry.at + offset
    }
    const workDir = await mkdtemp(join(workRoot, `scanfleet-r${id}-`))
    const stageFile = join(stageDir, `r${id}.json`)
    const record: LocalState.AssignmentRecord = {
      reservationId: id,
      slot,
      fence: view.fence,
      view,
      clockOffsetMs: offset,
      deadlines,
      status: "running",
      phase: null,
      lastSeq: 0,
      runner: null,
      tmpDir: workDir,
      stageFile,
      outcome: null,
      finalPhase: null,
      receipt: null,
      note: null
    }
    await state.putAssignment(record)
    await state.putSlot({ slot, reservationId: id, updatedAt: now })
    emit({ type: "claimed", slot, reservationId: id, at: now })
    await append(id, "assigned", `${view.target.source}:${view.target.identity}`.slice(0, 1000))
    const vars = { source: view.target.source, identity: view.target.identity, workDir, targetId: view.target.id }
    const end = await ExecutionUnit.run({
      job: {
        reservationId: id,
        target: { id: view.target.id, source: view.target.source, identity: view.target.identity },
        workDir,
        stageFile,
        scanner: spec,
        args: spec.kind === "command" ? Scanner.expand(spec.args, vars) : [],
        acquireArgs: spec.kind === "command" && spec.acquire ? Scanner.expand(spec.acquire.args, vars) : [],
        scanDeadline: deadlines.scan
      },
      deadline: deadlines.scan,
      graceMs,
      permits,
      signal: stopUnits.signal,
      ...(opts.childPath !== undefined ? { childPath: opts.childPath } : {}),
      onSpawn: async (runner) => {
        await state.putAssignment({ ...(await mustGet(id)), runner })
      },
      onPhase: async (phase, at) => {
        await state.append(id, { kind: "phase", phase, at })
        outbox.notify()
      }
    })
    // The unit and its group are gone and its permit is back: release its
    // files and free the slot. The result is produced next, before the slot
    // claims again; a crash in between leaves an open assignment that recovery finishes.
    await rm(workDir, { recursive: true, force: true })
    await state.putAssignment({ ...(await mustGet(id)), runner: null, tmpDir: null })
    await state.putSlot({ slot, reservationId: null, updatedAt: Date.now() })
    emit({ type: "slot_freed", slot, reservationId: id, at: Date.now(), end: end.kind, scanDeadline: deadlines.scan })
    switch (end.kind) {
      case "deadline":
        await finishEarly(
          id,
          "timed_out",
          "killed_at_deadline",
          end.phase,
          `the target-scan deadline (${clockIso(deadlines.scan)} on this device's clock) fired during ${end.phase}; ` +
            `sent ${end.signals.join(", ") || "nothing (the group had already ended)"} to the runner's process group` +
            (end.scannerStarted ? "" : "; the scanner never started") +
            (end.survivors.length > 0 ? `; survivors: ${end.survivors.join(", ")}` : "")
        )
        break
      case "stopped":
        // Nothing is known about the target, so it goes back to the queue rather than failing.
        await finishReleased(id, end.phase, `the device shut down during ${end.phase}; the runner's process group was killed and the reservation released`)
        break
      case "failed":
        await finishThroughUpload(id, "scan_error", end.phase, { findings: [], log: end.message })
        break
      case "staged": {
        const outcome = Scanner.classify(spec, end.staged)
        await finishThroughUpload(id, outcome === "killed_at_deadline" ? "scan_error" : outcome, end.phase, end.staged)
        break
      }
    }
  }

  /** Finishes what a previous run of the controller left: one `recovered` event per open timeline. */
  const recover = async () => {
    for (const a of await state.assignments({ open: true })) {
      const id = a.reservationId
      const killed = a.runner ? await ProcessTree.killStale(a.runner) : []
      if (a.tmpDir) await rm(a.tmpDir, { recursive: true, force: true })
      await state.putAssignment({ ...(await mustGet(id)), runner: null, tmpDir: null })
      emit({ type: "recovered", reservationId: id, phase: a.phase, killed })
      const last = await state.result(id)
      if (last !== null && last.delivery !== "pending") {
        // The last word was settled before the crash; only its bookkeeping was lost.
        if (last.delivery === "acked" && last.kind === "result") {
          // A resubmission returns the original receipt, and onResult then runs as usual.
          await state.markResult(id, "pending")
          outbox.notify()
        } else
          await onResult(
            id,
            last.delivery === "acked" ? { kind: "released" } : { kind: last.delivery === "refused" ? "refused" : "abandoned", message: last.error ?? last.delivery }
          )
        continue
      }
      // A crash between persisting the claim and its first event: the timeline starts now.
      if (a.phase === null) await append(id, "assigned", `${a.view.target.source}:${a.view.target.identity}`.slice(0, 1000))
      const phaseNow = (await mustGet(id)).phase!
      const terminal = PhaseModel.isTerminal(phaseNow)
      if (!terminal)
        await append(
          id,
          phaseNow,
          `the controller restarted during ${phaseNow}` + (a.runner ? `; ${killed.length} surviving process(es) of group ${a.runner.pgid} killed` : ""),
          "recovered"
        )
      if (last !== null) {
        // A queued result or release: the outbox resumes it.
        await state.putAssignment({ ...(await mustGet(id)), status: "delivering" })
        continue
      }
      if (terminal) {
        // The terminal event was journaled, its result was not: queue it after that event.
        const journal = await state.journal(id)
        const end = journal.at(-1)!
        const before = journal.filter((e) => e.kind === "phase" && !PhaseModel.isTerminal(e.phase)).at(-1)?.phase ?? "assigned"
        const cur = await mustGet(id)
        await state.putAssignment({ ...cur, status: "delivering", finalPhase: before })
        if (end.phase === "failed" && end.detail?.startsWith("the device shut down"))
          await state.putResult({ reservationId: id, afterSeq: end.seq, kind: "release", body: { fence: cur.fence } })
        else {
          const outcome = end.phase === "timed_out" ? "killed_at_deadline" : "scan_error"
          await state.putResult({ reservationId: id, afterSeq: end.seq, body: resultBody(cur.fence, outcome, before, [], end.detail ?? "") })
        }
        outbox.notify()
        continue
      }
      // A scan stage that staged its result before the crash resumes at the upload stage.
      let staged: Scanner.Staged | null = null
      if (a.stageFile && existsSync(a.stageFile)) {
        try {
          staged = Scanner.StagedSchema.parse(JSON.parse(await readFile(a.stageFile, "utf8")))
        } catch {
          staged = null
        }
      }
      if (staged !== null) {
        const outcome = Scanner.classify(spec, staged)
        await finishThroughUpload(id, outcome === "killed_at_deadline" ? "scan_error" : outcome, "staging", staged)
      } else if (PhaseModel.isScanStage(phaseNow) || phaseNow === "assigned") {
        if (Date.now() >= a.deadlines.scan)
          await finishEarly(id, "timed_out", "killed_at_deadline", phaseNow, `the target-scan deadline passed while the controller was down; the scan stage ended during ${phaseNow}`)
        else await finishEarly(id, "failed", "scan_error", phaseNow, `the controller restarted during ${phaseNow}; the execution unit was lost`)
      } else {
        // The upload stage began but neither the staged file nor the queued result survived.
        await finishEarly(id, "failed", "scan_error", phaseNow, `the controller restarted during ${phaseNow}; the staged result was lost`)
      }
    }
    for (const s of await state.slots()) if (s.reservationId !== null) await state.putSlot({ ...s, reservationId: null, updatedAt: Date.now() })
  }

  const slotLoop = async (slot: number) => {
    let backoff = 0
    while (!stopping) {
      let view: WorkerApi.AssignmentView | null
      const askedAt = Date.now()
      try {
        // No claim before the fleet key is known: whatever the device scans can be redacted.
        await redactor.ready()
        view = await client.claim(slot)
        backoff = 0
      } catch (e) {
        if (!(e instanceof Client.ApiRefused)) {
          backoff = Math.min(Math.max(backoff * 2, 200), 5000)
          emit({ type: "retry", reservationId: 0, message: `claim for slot ${slot}: ${(e as Error).message}` })
          await sleep(backoff)
        } else {
          // A slot whose last reservation still awaits its result is busy at the server for a moment; anything else needs an operator.
          if (!/slot_busy|capacity/.test(e.error)) emit({ type: "error", message: `claim for slot ${slot} refused: ${e.status} ${e.error}: ${e.message}` })
          await sleep(pollMs)
        }
        continue
      }
      if (view === null) {
        await sleep(pollMs)
        continue
      }
      try {
        await execute(slot, view, askedAt)
      } catch (e) {
        emit({ type: "error", message: `slot ${slot}, reservation ${view.reservationId}: ${(e as Error).stack ?? e}` })
        await sleep(pollMs)
      }
    }
  }

  await recover()
  startOutbox()
  for (let slot = 0; slot < opts.slots; slot++) {
    const known = (await state.slots()).find((s) => s.slot === slot)
    if (!known) await state.putSlot({ slot, reservationId: null, updatedAt: Date.now() })
  }
  const loops = Array.from({ length: opts.slots }, (_, slot) => slotLoop(slot))

  let stopped: Promise<void> | null = null
  return {
    state,
    stop: () =>
      (stopped ??= (async () => {
        stopping = true
        stopUnits.abort()
        for (const w of wakeSleepers) w()
        await Promise.all(loops)
        await sender?.drain(opts.drainMs ?? 3000)
        await sender?.stop()
        await state.close()
        await unlock()
      })())
  }
}

/** Labels the three deadlines of an assignment by meaning, with time remaining at `now` (device clock). */
export const describeDeadlines = (a: LocalState.AssignmentRecord, now: number) => {
  const d = { issuedAt: a.view.issuedAt + a.clockOffsetMs, scanDeadline: a.deadlines.scan, uploadDeadline: a.deadlines.upload, expiresAt: a.deadlines.expiry }
  return {
    rows: (["scanDeadline", "uploadDeadline", "expiresAt"] as const).map((w) => ({ which: w, label: Deadline.labels[w], at: d[w], remainingMs: d[w] - now })),
    next: Deadline.next(d, now)
  }
}
