import { Deadline, Findings, LogLine, PhaseModel, WorkerApi } from "@scanfleet/core"
import { Cause, Clock, Context, Data, Deferred, Duration, Effect, Exit, Fiber, FiberSet, Layer, ManagedRuntime, Option, Runtime, Schedule, type Scope, Stream, SubscriptionRef } from "effect"
import Sqlite from "better-sqlite3"
import { existsSync, readFileSync, renameSync, rmSync, statSync, truncateSync, writeFileSync } from "node:fs"
import { mkdir, mkdtemp, readdir, rename, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { basename, join } from "node:path"
import type { z } from "zod"
import * as Client from "./Client.js"
import * as Containment from "./Containment.js"
import * as DeviceClock from "./DeviceClock.js"
import * as ExecutionUnit from "./ExecutionUnit.js"
import * as Damage from "./internal/Damage.js"
import * as RemoveTree from "./internal/RemoveTree.js"
import * as LocalState from "./LocalState.js"
import * as Outbox from "./Outbox.js"
import * as Permits from "./Permits.js"
import * as ProcessTree from "./ProcessTree.js"
import * as Redaction from "./Redaction.js"
import * as Scanner from "./Scanner.js"
import * as UnitProtocol from "./UnitProtocol.js"

/**
 * The device controller, one Effect program: it registers with the server
 * (reporting its containment level, learning the server's fleet), sets aside
 * the files and rows of its own it finds damaged (saying each once, as an
 * error), recovers whatever a previous run left behind, then runs one scoped fiber per slot
 * that claims assignments and runs each scan stage as a sealed execution
 * unit under the hard target-scan deadline. Every phase is journaled before
 * it is acted on, and events and results leave through the outbox. Closing
 * the layer's scope stops claiming, ends running units (their reservations
 * are released), gives the outbox a moment, closes the state and drops the
 * lock file, in that order.
 */

/** Something the controller did, for logs, tests and benchmarks. */
/**
 * An `onEvent` that writes each event as one line of the one log schema
 * (`message` is the event's type; errors are `error`, retries `warning`).
 *
 * @example
 * Supervisor.layer({ ...opts, onEvent: Supervisor.eventLogger("pretty", (line) => process.stderr.write(`${line}\n`)) })
 */
export const eventLogger =
  (format: LogLine.Format, write: (line: string) => void) =>
  (e: DeviceEvent): void => {
    const { type, ...rest } = e
    // A line's time is the wall clock's: the event's own `at` is on the device clock (or, registering, the server's).
    const { at: _deviceTime, message, ...fields } = rest as Record<string, unknown>
    const level: LogLine.Level = type === "error" ? "error" : type === "retry" || type === "released" ? "warning" : "info"
    write(LogLine.format({ time: Date.now(), level, message: type, fields: message === undefined ? fields : { ...fields, error: message } }, format))
  }

// Without an `onEvent`, errors and retries still reach stderr, in the one log schema.
const stderrEvents = eventLogger("json", (line) => process.stderr.write(`${line}\n`))

export type DeviceEvent =
  | { readonly type: "registered"; readonly fleetId: string; readonly containment: Containment.Level; readonly at: number }
  | { readonly type: "claimed"; readonly slot: number; readonly fleetId: string; readonly reservationId: number; readonly at: number }
  | {
      readonly type: "slot_freed"
      readonly slot: number
      readonly fleetId: string
      readonly reservationId: number
      readonly at: number
      /**
       * How the scan stage ended; `unsupported` when the scanner has no command line for the target's source;
       * `cancelled` when the server ended the reservation while it ran (an operator cancelled it, or revoked the device) and the unit was killed.
       */
      readonly end: ExecutionUnit.End["kind"] | "unsupported" | "cancelled"
      /** The local target-scan deadline of the assignment. */
      readonly scanDeadline: number
    }
  | { readonly type: "recovered"; readonly fleetId: string; readonly reservationId: number; readonly phase: PhaseModel.Phase | null; readonly killed: ReadonlyArray<number> }
  | { readonly type: "delivered"; readonly fleetId: string; readonly reservationId: number; readonly delivered: Outbox.Delivered }
  | { readonly type: "retry"; readonly reservationId: number; readonly message: string }
  /** A reservation the server held on a slot of this device, unknown to its local state, given back; `message` says why. */
  | { readonly type: "released"; readonly slot: number; readonly fleetId: string; readonly reservationId: number; readonly message: string }
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
  /** SIGTERM → kill grace at the deadline, milliseconds (default 2000). */
  readonly graceMs?: number
  /** Wait between claims when nothing is pending, milliseconds (default 1000). */
  readonly pollMs?: number
  /**
   * While a unit runs, how often the device asks the server whether it still holds the reservation,
   * milliseconds (default 2000). A cancelled reservation, or one of a revoked device, has its unit
   * killed at once, as at the deadline; a refused write does the same as soon as it is answered.
   */
  readonly watchMs?: number
  /** Where work directories are created (default the OS temp dir). */
  readonly workRoot?: string
  /** Time a clean shutdown waits for the outbox, milliseconds (default 3000). */
  readonly drainMs?: number
  /** Outbox backoff bounds, milliseconds (default 100 ms and 5 s). */
  readonly minBackoffMs?: number
  readonly maxBackoffMs?: number
  /** Forces a containment level (default: the strongest the device allows, or `SCANFLEET_CONTAINMENT`). */
  readonly containment?: Containment.Level
  /** Receives every device event (default: JSON lines on stderr for errors and retries only). */
  readonly onEvent?: (e: DeviceEvent) => void
  /** The fleet key (hex) to fingerprint secrets with; fetched from the server when absent. */
  readonly fleetKey?: string
  /** Also upload secret values in the clear, for a server with a raw-upload key (opt-in; default false). */
  readonly rawUpload?: boolean
  /** Overrides the execution-unit script (tests). */
  readonly childPath?: string
}

/** Another controller runs on the same state file; starting a second one would kill its scans. */
export class StateInUse extends Data.TaggedError("StateInUse")<{ readonly file: string; readonly pid: number; readonly message: string }> {}

/**
 * The state file or its stage folder vanished (deleted, or replaced) under a running controller, or
 * SQLite answered that the file is damaged: nothing it runs could be recorded or delivered.
 */
export class StateGone extends Data.TaggedError("StateGone")<{ readonly file: string; readonly message: string }> {}

/** Why a device could not start. */
export type StartError = StateInUse | Scanner.ScannerMissing | Containment.ContainmentError | LocalState.StateError | LocalState.JournalRefused

/** A running device, as its layer provides it. */
export class Controller extends Context.Tag("@scanfleet/worker/Controller")<
  Controller,
  {
    /** The device's local state. */
    readonly state: LocalState.Service
    /** The containment its scan stages run under. */
    readonly containment: Containment.Plan
    /** The fleet of the server, once the device has heard from it. */
    readonly fleet: Effect.Effect<string | null>
    /** Fails once the device cannot go on (its state file or stage folder vanished); never succeeds. */
    readonly fatal: Effect.Effect<never, StateGone>
  }
>() {}

const clockIso = (ms: number) => new Date(ms).toISOString()

// Text the edge would refuse in a log (a NUL, an unpaired surrogate), shown as U+FFFD instead.
const unsendable = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g

/**
 * Builds a result body the server accepts, saying in the log what was cut: a finding the edge or
 * the finding schema would refuse (core's `WorkerApi.edgeIssue` at a finding's level in the body,
 * `Findings.Reported`) is left out rather than cost the whole result; then as many findings as
 * fit `maxResultBytes` beside the log, counted in the bytes of their JSON; the log without what
 * the edge refuses, cut to its limit.
 */
const resultBody = (
  fence: number,
  outcome: WorkerApi.AssignmentView["outcome"] & string,
  finalPhase: PhaseModel.Phase | null,
  findings: ReadonlyArray<Record<string, unknown>>,
  log: string
): z.infer<typeof WorkerApi.ResultRequest> => {
  const notes: Array<string> = []
  const conforming: Array<Record<string, unknown>> = []
  let refused = 0
  for (const f of findings) {
    const edge = WorkerApi.edgeIssue(f, 3)
    const shape = edge ? undefined : Findings.ReportedSchema.safeParse(f)
    const why = edge ? `${edge.path.join(".") || "(the finding)"}: ${edge.message}` : shape && !shape.success ? shape.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ") : undefined
    if (why === undefined) conforming.push(f)
    else if (refused++ === 0) notes.push(`[finding ${findings.indexOf(f)} left out, the server would refuse it: ${why.slice(0, 300)}]`)
  }
  if (refused > 1) notes.push(`[${refused} findings left out in all, each one the server would refuse]`)
  const limit = WorkerApi.maxLogChars - 5_000
  const tail = (text: string) => (text.length > limit ? text.slice(text.length - limit) : text).replace(unsendable, "\ufffd")
  // Room for the findings: the result limit less the log as sent (escaped), the notes and the rest of the body.
  const budget = WorkerApi.maxResultBytes - Buffer.byteLength(JSON.stringify(tail(log))) - 8_192
  const kept: Array<Record<string, unknown>> = []
  let used = 2
  for (const f of conforming.slice(0, WorkerApi.maxFindings)) {
    const bytes = Buffer.byteLength(JSON.stringify(f)) + 1
    if (used + bytes > budget) break
    used += bytes
    kept.push(f)
  }
  if (conforming.length > WorkerApi.maxFindings && kept.length === WorkerApi.maxFindings) notes.push(`[${conforming.length - WorkerApi.maxFindings} findings cut at the ${WorkerApi.maxFindings} limit]`)
  else if (kept.length < conforming.length) notes.push(`[findings cut to ${kept.length} of ${conforming.length} to fit the result size limit]`)
  const text = notes.length > 0 ? `${log}\n${notes.join("\n")}` : log
  return { fence, outcome, finalPhase, findings: kept, log: tail(text) }
}

/**
 * Takes the state file's lock for the scope. The lock itself is a write lock
 * on an SQLite database beside the state file (`FILE.lock.db`), taken with
 * no wait by a connection open for the controller's life: SQLite locks with
 * fcntl, so two starters can never both hold it and the kernel drops it when
 * its process dies, however it dies. `FILE.lock` names the holder (pid and
 * start time) for the refusal and for people; it is written only by the
 * holder and read only as a name, except that one naming a live controller
 * of an older build (which knows only this file) is honoured.
 *
 * The lock database holds nothing: one SQLite cannot read (a disk fault, an
 * overwrite) is copied aside, said through `onDamaged`, and emptied in place.
 * In place, because another starter may hold it at that moment: emptying it
 * changes nothing for a holder, where replacing the file would let two
 * controllers hold two locks.
 */
const lock = (file: string, onDamaged: (message: string) => void): Effect.Effect<void, StateInUse, Scope.Scope> => {
  const me = JSON.stringify({ pid: process.pid, startTime: ProcessTree.startTime(process.pid) })
  const read = () => {
    try {
      return readFileSync(file, "utf8")
    } catch {
      return ""
    }
  }
  // The live process `FILE.lock` names, or 0: a lock whose process is gone, or whose pid was reused, names nobody.
  const named = (): number => {
    const held = (() => {
      try {
        return JSON.parse(read()) as { pid?: unknown; startTime?: unknown }
      } catch {
        return {}
      }
    })()
    const pid = typeof held.pid === "number" && held.pid > 0 ? held.pid : 0
    const now = pid > 0 ? ProcessTree.stat(pid) : null
    return now !== null && now.state !== "Z" && (held.startTime === null || now.startTime === held.startTime) ? pid : 0
  }
  const inUse = (pid: number) =>
    new StateInUse({ file, pid, message: `the state file is in use by a running controller${pid > 0 ? ` (pid ${pid})` : ""}; stop it first` })
  const emptyDamaged = (damage: { readonly code: string; readonly message: string }) =>
    Effect.sync(() => {
      const aside = Damage.copyAside(`${file}.db`, new Date())
      truncateSync(`${file}.db`, 0)
      onDamaged(`the lock database ${file}.db was damaged (${damage.code}: ${damage.message}); a copy was set aside as ${aside} and it was emptied (it holds nothing but the lock)`)
    })
  const take = Effect.gen(function* () {
    const db = new Sqlite(`${file}.db`, { timeout: 0 })
    const begin = Effect.try({ try: () => db.exec("BEGIN IMMEDIATE"), catch: (e) => e as { code?: string } })
    const taken = yield* begin.pipe(
      Effect.catchAll((e) => {
        const damage = Damage.sqliteDamage(e)
        return damage === null ? Effect.fail(e) : Effect.zipRight(emptyDamaged(damage), begin)
      }),
      Effect.as(true),
      Effect.catchAll((e) => (e.code === "SQLITE_BUSY" ? Effect.succeed(false) : Effect.die(e)))
    )
    if (!taken) {
      db.close()
      // The holder names itself right after taking the lock: give it a moment to.
      const pid = yield* Effect.suspend(() => {
        const p = named()
        return p > 0 ? Effect.succeed(p) : Effect.fail(p)
      }).pipe(Effect.retry({ schedule: Schedule.spaced(Duration.millis(50)), times: 20 }), Effect.orElseSucceed(() => 0))
      return yield* inUse(pid)
    }
    const legacy = named()
    if (legacy > 0 && legacy !== process.pid) {
      db.close()
      return yield* inUse(legacy)
    }
    writeFileSync(`${file}.${process.pid}.tmp`, me)
    renameSync(`${file}.${process.pid}.tmp`, file)
    return db
  })
  return Effect.asVoid(
    Effect.acquireRelease(take, (db) =>
      Effect.sync(() => {
        rmSync(file, { force: true })
        db.close()
      })
    )
  )
}

/**
 * A stage folder that is not a folder (a file took its name) is set aside, so
 * the folder can be made; what is in a folder is for recovery to judge.
 */
const setAsideStageFolder = (dir: string, say: (message: string) => Effect.Effect<void>): Effect.Effect<void> =>
  Effect.suspend(() => {
    const found = statSync(dir, { throwIfNoEntry: false })
    if (found === undefined || found.isDirectory()) return Effect.void
    return say(`the stage folder ${dir} was not a folder (a file took its name); set aside as ${Damage.setAside(dir, new Date())}. A result staged in the folder before is not found any more`)
  })

/**
 * The device as a scoped layer: everything it started lives in the layer's
 * scope and ends with it.
 *
 * @example
 * const DeviceLive = Supervisor.layer({ server: "http://127.0.0.1:8080", token, slots: 2, state: "./worker.db", scanner: Scanner.demo() })
 * await Effect.runPromise(Layer.launch(DeviceLive))
 */
export const layer = (opts: Options): Layer.Layer<Controller, StartError> => Layer.scoped(Controller, make(opts))

/** The device program: acquires everything in the current scope and returns once the slots run. */
export const make = (opts: Options): Effect.Effect<Context.Tag.Service<Controller>, StartError, Scope.Scope> =>
  Effect.gen(function* () {
    yield* Scanner.requireBinaries(opts.scanner)
    const plan = yield* Containment.detect({ force: opts.containment })
    // Damaged files found and set aside before the device logs anything: it says them first.
    const setAside: Array<string> = []
    yield* lock(`${opts.state}.lock`, (message) => setAside.push(message))
    // Every deadline comparison, and every time stored to be compared later, is on the device clock (wall-clock steps
    // cannot move it). Its anchor file is read under the lock, so no other starter sets the same file aside.
    const deviceClock = DeviceClock.forState(opts.state, (d) =>
      setAside.push(
        `the device clock's anchor file ${d.file} was damaged (${d.problem}); set aside as ${d.setAsideAs} and a fresh anchor taken: ` +
          "deadlines of open assignments, kept on the device clock, move by as much as the wall clock was stepped since this boot began (nothing if it was not)"
      )
    )
    return yield* Effect.withClock(program(opts, plan, deviceClock, setAside), DeviceClock.effectClock(deviceClock))
  })

const program = (
  opts: Options,
  plan: Containment.Plan,
  deviceClock: DeviceClock.DeviceClock,
  setAside: ReadonlyArray<string>
): Effect.Effect<Context.Tag.Service<Controller>, StartError, Scope.Scope> =>
  Effect.gen(function* () {
    const emit = (e: DeviceEvent) =>
      Effect.sync(() => (opts.onEvent ? opts.onEvent(e) : (e.type === "error" || e.type === "retry") && stderrEvents(e)))
    for (const message of setAside) yield* emit({ type: "error", message })
    const spec = opts.scanner
    // Unit cgroups a dead controller left behind (their units died with it, or were stopped) are emptied
    // and removed before any unit of this one runs; recovery counts what died there as its units' survivors.
    const reclaimed = yield* Containment.reclaim(plan)
    const stageDir = LocalState.stageFolder(opts.state)
    yield* setAsideStageFolder(stageDir, (message) => emit({ type: "error", message }))
    const reset = yield* LocalState.resetIfDamaged(opts.state)
    const state = yield* Effect.provide(
      LocalState.State,
      yield* Layer.build(
        LocalState.layer(opts.state, {
          onDamaged: (row) =>
            emit({ type: "error", message: `the state file ${opts.state}: a row of its ${row.table} table (${row.key}) was damaged (${row.problem}) and set aside: ${row.lost}` })
        })
      )
    )
    if (reset !== null) {
      yield* state.putReset(reset)
      yield* emit({
        type: "error",
        message: `the state file ${opts.state} was damaged (${reset.code}: ${reset.problem}); set aside as ${reset.setAsideAs} and started afresh. Lost with it: ${reset.lost}`
      })
    }
    const client = Client.make({ server: opts.server, token: opts.token })
    const redactor = Redaction.make({ server: opts.server, token: opts.token, scanner: spec, fleetKey: opts.fleetKey, rawUpload: opts.rawUpload })
    const permits = yield* Permits.makeEffect(opts.permits ?? opts.slots)
    const graceMs = opts.graceMs ?? 2000
    const pollMs = Duration.millis(opts.pollMs ?? 1000)
    const watchMs = Duration.millis(opts.watchMs ?? 2000)
    const workRoot = opts.workRoot ?? tmpdir()
    yield* Effect.promise(() => mkdir(stageDir, { recursive: true }))
    // SQLite goes on writing a deleted file's inode and a unit cannot stage into a deleted folder: every later
    // scan would end as a silent scan_error. Looked at before each claim; the device then stops with an error.
    const stateIno = statSync(opts.state, { throwIfNoEntry: false })?.ino
    const fatal = yield* Deferred.make<never, StateGone>()
    const stateGone = Effect.gen(function* () {
      if (yield* Deferred.isDone(fatal)) return true
      const seen = statSync(opts.state, { throwIfNoEntry: false })
      const gone = seen === undefined || seen.ino !== stateIno ? opts.state : existsSync(stageDir) ? null : stageDir
      if (gone === null) return false
      const message = `${gone} was deleted or replaced while the controller ran; stopping (start the controller again to begin a new state file)`
      yield* emit({ type: "error", message })
      yield* Deferred.fail(fatal, new StateGone({ file: gone, message }))
      return true
    })
    // Damage SQLite finds while the controller runs stops it, said once: every later write would fail too, and
    // each claim would hold a reservation nothing records. The next start sets the file aside and starts afresh.
    yield* Effect.forkScoped(
      Effect.flatMap(state.fileDamaged, (e) => {
        const message = `${e.message} while the controller ran: ${opts.state}; stopping (the next start sets it aside and starts a fresh one)`
        return Effect.zipRight(emit({ type: "error", message }), Deferred.fail(fatal, new StateGone({ file: opts.state, message })))
      })
    )
    // The fleet is in the name: a reservation id alone repeats across databases.
    const stageFileOf = (k: LocalState.Key) => join(stageDir, `${k.fleetId}-r${k.reservationId}.json`)
    /** Removes an assignment's stage file, and the unit's half-written one, once nothing can come of them. */
    const dropStage = (k: LocalState.Key) =>
      Effect.asVoid(Effect.promise(() => Promise.all([rm(stageFileOf(k), { force: true }), rm(`${stageFileOf(k)}.tmp`, { force: true })])))
    // Work folders are removed off the slot's path (a scanner may leave hundreds of thousands of files
    // there): renamed away at once, so nothing reuses the path, then deleted in the background, by a
    // child process, off this event loop (RemoveTree). The name says which controller deletes it; one
    // whose controller died is swept at the next start.
    const removals = yield* FiberSet.make()
    const trashOf = /^scanfleet-r\d+-.+\.removing-(\d+)$/
    const removeInBackground = (dir: string | null) =>
      dir === null
        ? Effect.void
        : Effect.asVoid(
            FiberSet.run(
              removals,
              RemoveTree.removeTree(dir).pipe(Effect.catchAll((e) => emit({ type: "error", message: `could not remove the work folder ${dir}: ${e.message}` })))
            )
          )
    /** Renames a work folder out of the way; the path to remove (null when there is none). */
    const moveAway = (dir: string) =>
      Effect.promise(() => rename(dir, `${dir}.removing-${process.pid}`).then(() => `${dir}.removing-${process.pid}`, (e: NodeJS.ErrnoException) => (e.code === "ENOENT" ? null : dir)))
    const discard = (dir: string) => Effect.flatMap(moveAway(dir), removeInBackground)
    for (const name of yield* Effect.promise(() => readdir(workRoot).catch(() => [] as Array<string>))) {
      const m = trashOf.exec(name)
      if (m !== null && !ProcessTree.isAlive(Number(m[1]))) yield* removeInBackground(join(workRoot, name))
    }
    const runtime = yield* Effect.runtime<never>()
    const runPromise = Runtime.runPromise(runtime)
    const now = Clock.currentTimeMillis
    yield* state.putController({ pid: process.pid, startedAt: yield* now, server: client.server, containment: plan.level, scanner: spec.name, slots: opts.slots })

    // The fleet of the server the client talks to: learned at registration or from a claim.
    const fleet = yield* SubscriptionRef.make<string | null>(null)
    const recovered = yield* Deferred.make<void>()
    // Waits for recovery to settle every record (so the outbox and recovery never write the same row at once) and for the fleet.
    const fleetNow: Effect.Effect<string> = Effect.zipRight(
      Deferred.await(recovered),
      fleet.changes.pipe(Stream.filterMap(Option.fromNullable), Stream.runHead, Effect.map(Option.getOrElse(() => "")))
    )
    const sawFleet = (fleetId: string) =>
      Effect.gen(function* () {
        if ((yield* SubscriptionRef.get(fleet)) === fleetId) return
        yield* state.sawFleet(fleetId, client.server, yield* now)
        yield* SubscriptionRef.set(fleet, fleetId)
      })

    const mustGet = (k: LocalState.Key) =>
      Effect.flatMap(state.assignment(k), (a) =>
        a === null ? Effect.fail(new LocalState.StateError({ reason: "missing", message: `assignment ${k.reservationId} of fleet ${k.fleetId} vanished from the local state` })) : Effect.succeed(a)
      )

    const onResult = (k: LocalState.Key, d: Outbox.Delivered) =>
      Effect.gen(function* () {
        const a = yield* mustGet(k)
        const terminal = a.phase !== null && PhaseModel.isTerminal(a.phase)
        if (!terminal) {
          // The server closed the reservation with the result, so this last event stays local.
          if (d.kind === "accepted")
            yield* state.append(k, { kind: "phase", phase: "completed", at: yield* now, detail: `receipt ${d.receipt.receiptId}: ${d.receipt.outcome}` }, "local")
          else yield* state.append(k, { kind: "phase", phase: "failed", at: yield* now, detail: d.kind === "released" ? "released" : d.message }, "local")
        }
        const after = yield* mustGet(k)
        // The outcome is the receipt's: a resubmission (after a restart lost the first answer) is answered with
        // the original receipt, and the server keeps the outcome of the result it accepted first.
        const receipt = d.kind === "accepted" ? d.receipt : null
        const overruled = receipt !== null && after.outcome !== null && receipt.outcome !== after.outcome
        yield* state.putAssignment({
          ...after,
          status: "done",
          receipt: receipt ?? after.receipt,
          outcome: receipt?.outcome ?? after.outcome,
          note: overruled
            ? `the server had accepted a result of this reservation before, with outcome ${receipt.outcome}; this device sent ${after.outcome}`
            : d.kind === "accepted"
              ? after.note
              : d.kind === "released"
                ? "released: the target went back to the queue"
                : d.message
        })
        yield* dropStage(k)
        yield* emit({ type: "delivered", ...k, delivered: d })
      })

    // The running units, each with the way to kill it because the server no longer holds its reservation.
    const running = new Map<string, (message: string) => void>()
    const unitKey = (k: LocalState.Key) => `${k.fleetId}/${k.reservationId}`
    const lose = (k: LocalState.Key, message: string) => Effect.sync(() => running.get(unitKey(k))?.(message))

    const outbox = yield* Outbox.make({
      state,
      client,
      fleet: fleetNow,
      // A refused write of a running unit's reservation means the server ended it: no result of the unit can be accepted any more.
      onRefused: (k, r) => (lost(r) ? lose(k, `${r.status} ${r.error}: ${r.message}`) : Effect.void),
      ...(opts.minBackoffMs !== undefined ? { minBackoffMs: opts.minBackoffMs } : {}),
      ...(opts.maxBackoffMs !== undefined ? { maxBackoffMs: opts.maxBackoffMs } : {}),
      onResult,
      // A queued result set aside as damaged while the controller runs is queued again as a restart would (below).
      onResultLost: (k) => Effect.suspend(() => requeueLostResult(k)),
      // Emitting is synchronous, so a plain callback can run it.
      onRetry: (k, message) => Effect.runSync(emit({ type: "retry", reservationId: k?.reservationId ?? 0, message }))
    })
    // Runs before the sender is interrupted (finalizers run last-added first).
    yield* Effect.addFinalizer(() => Effect.asVoid(outbox.drain(opts.drainMs ?? 3000)))

    const append = (k: LocalState.Key, phase: PhaseModel.Phase, detail?: string, kind: "phase" | "recovered" = "phase") =>
      Effect.gen(function* () {
        const e = yield* state.append(k, { kind, phase, at: yield* now, ...(detail !== undefined ? { detail } : {}) })
        yield* outbox.notify
        return e
      })

    /** Ends an assignment whose scan stage stopped early: a terminal event, then the result. */
    const finishEarly = (
      k: LocalState.Key,
      terminal: "timed_out" | "failed",
      outcome: "killed_at_deadline" | "scan_error",
      finalPhase: PhaseModel.Phase | null,
      log: string
    ) =>
      Effect.gen(function* () {
        const e = yield* append(k, terminal, log.slice(0, 1000))
        const a = yield* mustGet(k)
        // The record first: once the result is queued, the outbox may finish the assignment at any moment.
        yield* state.putAssignment({ ...a, status: "delivering", outcome, finalPhase })
        yield* state.putResult({ ...k, afterSeq: e.seq, body: resultBody(a.fence, outcome, finalPhase, [], log) })
        yield* dropStage(k)
        yield* outbox.notify
      })

    /** Ends an assignment the device gives up on while the fleet can still use it: a terminal event, then a release. */
    const finishReleased = (k: LocalState.Key, finalPhase: PhaseModel.Phase, detail: string) =>
      Effect.gen(function* () {
        const e = yield* append(k, "failed", detail.slice(0, 1000))
        const a = yield* mustGet(k)
        yield* state.putAssignment({ ...a, status: "delivering", finalPhase })
        yield* state.putResult({ ...k, afterSeq: e.seq, kind: "release", body: { fence: a.fence } })
        yield* dropStage(k)
        yield* outbox.notify
      })

    /** Runs the upload stage's local part: bundle the result, queue it; the outbox waits for the receipt. */
    const finishThroughUpload = (
      k: LocalState.Key,
      outcome: Exclude<z.infer<typeof WorkerApi.Receipt>["outcome"], "killed_at_deadline">,
      finalPhase: PhaseModel.Phase | null,
      staged: { readonly findings: ReadonlyArray<Record<string, unknown>>; readonly log: string }
    ) =>
      Effect.gen(function* () {
        const started = yield* mustGet(k)
        if (started.phase === null || PhaseModel.canTransition(started.phase, "bundling")) yield* append(k, "bundling")
        const a = yield* mustGet(k)
        // Redaction: no declared secret value leaves the device (nor reaches the local result queue), in the findings or in the log.
        const redacted = yield* Effect.promise((signal) => redactor.result(staged, signal))
        const body = resultBody(a.fence, outcome, finalPhase, redacted.findings, redacted.log)
        if (a.phase !== "uploading" && a.phase !== "awaiting_receipt") yield* append(k, "uploading")
        const cur = yield* mustGet(k)
        const waiting = cur.phase === "awaiting_receipt" ? cur.lastSeq : (yield* append(k, "awaiting_receipt")).seq
        yield* state.putAssignment({ ...(yield* mustGet(k)), status: "delivering", outcome, finalPhase })
        // The stage file stays until the result is settled (onResult): the commit that queued it is not
        // synced, and a power cut that loses it must find the staged result again, not a missing one.
        yield* state.putResult({ ...k, afterSeq: waiting, body })
        yield* outbox.notify
      })

    // The timeline names what the unit starts once it is prepared: a runner module (the unit calls it right after preparing) or a command.
    const starting =
      spec.kind === "module"
        ? `starting the runner ${spec.name} (${spec.exportName} of ${basename(spec.module)})`
        : `starting the scanner ${spec.name} (${basename(spec.command)}${spec.acquire ? `, after ${basename(spec.acquire.command)}` : ""})`
    // A runner module starts as soon as its unit is prepared; a command when the unit says it spawned it.
    const scannerStarted = (end: { readonly phase: PhaseModel.Phase; readonly scannerStarted: boolean }) =>
      end.scannerStarted || (spec.kind === "module" && end.phase !== "assigned" && end.phase !== "permit_wait")

    const classified = (staged: Scanner.Staged) => {
      const outcome = Scanner.classify(spec, staged)
      return outcome === "killed_at_deadline" ? "scan_error" : outcome
    }

    // Aborted first when the scope closes, so running units end (as "stopped") before their fibers are awaited.
    const stopUnits = new AbortController()

    /**
     * Asks the server, every `watchMs` while the unit runs, whether it still holds the
     * reservation. One that ended there is probed with the release the device would send
     * anyway: a release of an ended reservation can only be refused, and the refusal says
     * why (`reservation_refused:cancelled` names who cancelled it and why).
     */
    const watch = (k: LocalState.Key, fence: number) =>
      Effect.gen(function* () {
        for (;;) {
          yield* Effect.sleep(watchMs)
          const seen = yield* Effect.either(client.get(k.reservationId))
          if (seen._tag === "Left") {
            if (seen.left._tag === "ApiRefused" && lost(seen.left)) return yield* lose(k, `${seen.left.status} ${seen.left.error}: ${seen.left.message}`)
            // The outbox keeps retrying a 401 (the journal outlives a token change), but a unit whose device
            // the server no longer knows (a revoked device's reservations ended with it) cannot deliver anything.
            if (seen.left.status === 401)
              return yield* lose(k, `401 unauthorized: the server no longer accepts this device's token (the device was revoked); its reservations ended with it`)
            // Unreachable, or a refusal that says nothing of the reservation: the unit runs on and the device asks again.
            yield* emit({ type: "retry", reservationId: k.reservationId, message: `watching the reservation: ${seen.left.message}` })
            continue
          }
          if (seen.right.state === "active" && seen.right.fence === fence) continue
          const probe = yield* Effect.either(client.release(k.reservationId, { fence }))
          return yield* lose(
            k,
            probe._tag === "Left" && probe.left._tag === "ApiRefused"
              ? `${probe.left.status} ${probe.left.error}: ${probe.left.message}`
              : `the server ended reservation ${k.reservationId} (${seen.right.state})`
          )
        }
      })

    /** Ends an assignment the server ended while its unit ran: the terminal event stays local (the server refuses every write of it). */
    const finishCancelled = (k: LocalState.Key, end: Extract<ExecutionUnit.End, { kind: "deadline" | "stopped" }>, message: string) =>
      Effect.gen(function* () {
        const detail =
          `the server ended the reservation during ${end.phase}: ${message}; the unit was killed ` +
          `(${end.signals.join(", ") || "it had already ended"}, containment ${end.level})` +
          (end.survivors.length > 0 ? `; survivors: ${end.survivors.join(", ")}` : "")
        yield* state.append(k, { kind: "phase", phase: "failed", at: yield* now, detail: detail.slice(0, 1000) }, "local")
        yield* state.putAssignment({ ...(yield* mustGet(k)), status: "done", finalPhase: end.phase, note: message.slice(0, 1000) })
        yield* dropStage(k)
        yield* emit({ type: "delivered", ...k, delivered: { kind: "refused", message } })
      })

    const execute = (slot: number, view: WorkerApi.AssignmentView, askedAt: number) =>
      Effect.gen(function* () {
        const k: LocalState.Key = { fleetId: view.fleetId, reservationId: view.reservationId }
        const id = view.reservationId
        const claimedAt = yield* now
        // Measured from when the claim was sent, the offset errs early: the device
        // stops by the server's deadline even with the request's latency unknown.
        const offset = askedAt - view.serverNow
        const deadlines = {
          scan: view.deadlines.targetScan.at + offset,
          upload: view.deadlines.resultUpload.at + offset,
          expiry: view.deadlines.assignmentExpiry.at + offset
        }
        const workDir = yield* Effect.promise(() => mkdtemp(join(workRoot, `scanfleet-r${id}-`)))
        const stageFile = stageFileOf(k)
        yield* state.putAssignment({
          ...k,
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
        })
        yield* state.putSlot({ slot, ...k, updatedAt: claimedAt })
        yield* emit({ type: "claimed", slot, ...k, at: claimedAt })
        yield* append(k, "assigned", `${view.target.source}:${view.target.identity}`.slice(0, 1000))
        const vars = { source: view.target.source, identity: view.target.identity, workDir, targetId: view.target.id }
        if (!Scanner.supports(spec, view.target.source)) {
          // Nothing to run: the target is unresolved for this scanner, and the slot is free at once.
          yield* discard(workDir)
          yield* state.putAssignment({ ...(yield* mustGet(k)), tmpDir: null })
          yield* state.putSlot({ slot, fleetId: null, reservationId: null, updatedAt: yield* now })
          yield* emit({ type: "slot_freed", slot, ...k, at: yield* now, end: "unsupported", scanDeadline: deadlines.scan })
          return yield* finishThroughUpload(k, "unsupported", null, { findings: [], log: `the ${spec.name} scanner has no command line for ${view.target.source} targets` })
        }
        // The unit stops when the device shuts down, or when the server no longer holds its reservation.
        const unitStop = new AbortController()
        const shutdown = () => unitStop.abort()
        stopUnits.signal.addEventListener("abort", shutdown, { once: true })
        if (stopUnits.signal.aborted) unitStop.abort()
        let lostBecause: string | null = null
        running.set(unitKey(k), (message) => {
          if (lostBecause !== null) return
          lostBecause = message
          unitStop.abort()
        })
        const watcher = yield* Effect.forkDaemon(Effect.interruptible(watch(k, view.fence)))
        const end = yield* Effect.promise(() =>
          ExecutionUnit.run({
            job: {
              reservationId: id,
              target: { id: view.target.id, source: view.target.source, identity: view.target.identity },
              workDir,
              stageFile,
              scanner: spec,
              args: spec.kind === "command" ? Scanner.expand(spec.args, vars, spec.hosts) : [],
              acquireArgs: spec.kind === "command" && spec.acquire ? Scanner.expand(spec.acquire.args, vars, spec.hosts) : [],
              scanDeadline: deadlines.scan
            },
            deadline: deadlines.scan,
            clock: deviceClock,
            graceMs,
            permits,
            containment: plan,
            signal: unitStop.signal,
            ...(opts.childPath !== undefined ? { childPath: opts.childPath } : {}),
            onSpawn: (runner) => runPromise(Effect.flatMap(mustGet(k), (a) => state.putAssignment({ ...a, runner }))),
            onPhase: (phase, at) =>
              runPromise(Effect.zipRight(state.append(k, { kind: "phase", phase, at, ...(phase === "preparing" ? { detail: starting } : {}) }), outbox.notify)),
            // The kill began: whatever the unit stages from now on (a scanner told to stop may still exit 0) is
            // not the scan's result, and a restart in the middle of the kill must not take it for one.
            onKill: () => runPromise(Effect.zipRight(Effect.flatMap(mustGet(k), (a) => state.putAssignment({ ...a, stageFile: null })), dropStage(k)))
          })
        )
        running.delete(unitKey(k))
        stopUnits.signal.removeEventListener("abort", shutdown)
        yield* Fiber.interrupt(watcher)
        const cancelled = end.kind === "stopped" && lostBecause !== null ? { end, message: lostBecause as string } : null
        // The unit and everything it started are gone and its permit is back:
        // release its files and free the slot. The result is produced next,
        // before the slot claims again; a crash in between leaves an open
        // assignment that recovery finishes. The work folder is removed last,
        // in the background: neither the slot nor the result waits for it.
        const doomed = yield* moveAway(workDir)
        yield* state.putAssignment({ ...(yield* mustGet(k)), runner: null, tmpDir: null })
        yield* state.putSlot({ slot, fleetId: null, reservationId: null, updatedAt: yield* now })
        yield* emit({ type: "slot_freed", slot, ...k, at: yield* now, end: cancelled ? "cancelled" : end.kind, scanDeadline: deadlines.scan })
        return yield* Effect.ensuring(settle(k, end, cancelled), removeInBackground(doomed))
      })

    /** Produces the result of a scan stage that ended (or the local end of a cancelled one). */
    const settle = (k: LocalState.Key, end: ExecutionUnit.End, cancelled: { readonly end: Extract<ExecutionUnit.End, { kind: "deadline" | "stopped" }>; readonly message: string } | null) =>
      Effect.gen(function* () {
        if (cancelled) return yield* finishCancelled(k, cancelled.end, cancelled.message)
        const a = yield* mustGet(k)
        switch (end.kind) {
          case "deadline":
            return yield* finishEarly(
              k,
              "timed_out",
              "killed_at_deadline",
              end.phase,
              `the target-scan deadline (${clockIso(deviceClock.toWall(a.deadlines.scan))} on this device's wall clock) fired during ${end.phase}; ` +
                `sent ${end.signals.join(", ") || "nothing (the unit had already ended)"} to the unit (containment ${end.level})` +
                (scannerStarted(end) ? "" : "; the scanner never started") +
                (end.survivors.length > 0 ? `; survivors: ${end.survivors.join(", ")}` : "") +
                (end.log ? `\n${end.log}` : "")
            )
          case "stopped":
            // Nothing is known about the target, so it goes back to the queue rather than failing.
            return yield* finishReleased(k, end.phase, `the device shut down during ${end.phase}; the unit was killed (containment ${end.level}) and the reservation released`)
          case "failed":
            return yield* finishThroughUpload(k, "scan_error", end.phase, { findings: [], log: end.message })
          case "staged":
            return yield* finishThroughUpload(k, classified(end.staged), end.phase, end.staged)
        }
      })

    /** Why an assignment is picked up again, in its journal's words. */
    interface Resumed {
      readonly during: string
      readonly meanwhile: string
    }
    const restarted: Resumed = { during: "the controller restarted", meanwhile: "the controller was down" }

    /**
     * What a previous run staged for an assignment (`stage`, null for nothing). A stage file that holds
     * something else than a staged result (cut short, overwritten) is set aside and said, and `damaged` says
     * so for the journal; one that is gone, or cannot be read, is nothing staged.
     */
    const previouslyStaged = (k: LocalState.Key, file: string) =>
      Effect.tryPromise({ try: () => UnitProtocol.readStaged(file), catch: (e) => e }).pipe(
        Effect.map((stage) => ({ stage, damaged: "" })),
        Effect.catchAll((e) =>
          e instanceof UnitProtocol.StageDamaged
            ? Effect.try(() => `set aside as ${Damage.setAside(file, new Date())}`).pipe(
                Effect.catchAll((failed) => Effect.succeed(`left where it is (it could not be renamed: ${String(failed.error)})`)),
                Effect.tap((aside) =>
                  emit({
                    type: "error",
                    message: `the stage file ${file} of reservation ${k.reservationId} (fleet ${k.fleetId}) was damaged (${e.message}); ${aside}: the scan's result is lost with it, and the reservation ends without it`
                  })
                ),
                Effect.map((aside) => ({ stage: null, damaged: `; its staged result was damaged (${e.message}) and ${aside}` }))
              )
            : Effect.succeed({ stage: null, damaged: "" })
        )
      )

    /** Finishes one assignment whose controller lost track of it (a restart, or a state write that failed): one `recovered` event. */
    const recoverOne = (a: LocalState.AssignmentRecord, why: Resumed) =>
      Effect.gen(function* () {
        const k: LocalState.Key = { fleetId: a.fleetId, reservationId: a.reservationId }
        // The unit's survivors: what the start reclaimed from its cgroup, and what was left of its group.
        const fromCgroup = a.runner?.cgroup ? (reclaimed.get(a.runner.cgroup) ?? []) : []
        const killed = a.runner ? [...new Set([...fromCgroup, ...(yield* Effect.promise(() => ProcessTree.killStale(a.runner!)))])] : []
        if (a.tmpDir) yield* discard(a.tmpDir)
        yield* state.putAssignment({ ...(yield* mustGet(k)), runner: null, tmpDir: null })
        yield* emit({ type: "recovered", ...k, phase: a.phase, killed })
        const last = yield* state.result(k)
        if (last !== null && last.delivery !== "pending") {
          // The last word was settled before the crash; only its bookkeeping was lost.
          if (last.delivery === "acked" && last.kind === "result") {
            // A resubmission returns the original receipt, and onResult then runs as usual.
            yield* state.markResult(k, "pending")
          } else
            yield* onResult(
              k,
              last.delivery === "acked" ? { kind: "released" } : { kind: last.delivery === "refused" ? "refused" : "abandoned", message: last.error ?? last.delivery }
            )
          return
        }
        // A crash between persisting the claim and its first event: the timeline starts now.
        if (a.phase === null) yield* append(k, "assigned", `${a.view.target.source}:${a.view.target.identity}`.slice(0, 1000))
        const opened = yield* mustGet(k)
        const phaseNow = opened.phase!
        const terminal = PhaseModel.isTerminal(phaseNow)
        // Past PhaseModel.lastRecoverySeq the server refuses a recovery (the timeline keeps its
        // room for the remaining phases), so the restart is only in the device's log.
        if (!terminal && opened.lastSeq < PhaseModel.lastRecoverySeq)
          yield* append(
            k,
            phaseNow,
            `${why.during} during ${phaseNow}` + (a.runner ? `; ${killed.length} surviving process(es) of the unit (pid ${a.runner.pid}) killed` : ""),
            "recovered"
          )
        if (last !== null) {
          // A queued result or release: the outbox resumes it.
          yield* state.putAssignment({ ...(yield* mustGet(k)), status: "delivering" })
          return
        }
        if (terminal) {
          // The terminal event was journaled, its result was not: queue it after that event.
          const journal = yield* state.journal(k)
          const end = journal.at(-1)!
          const before = journal.filter((e) => e.kind === "phase" && !PhaseModel.isTerminal(e.phase)).at(-1)?.phase ?? "assigned"
          const cur = yield* mustGet(k)
          yield* state.putAssignment({ ...cur, status: "delivering", finalPhase: before })
          if (end.phase === "failed" && end.detail?.startsWith("the device shut down"))
            yield* state.putResult({ ...k, afterSeq: end.seq, kind: "release", body: { fence: cur.fence } })
          else {
            const outcome = end.phase === "timed_out" ? "killed_at_deadline" : "scan_error"
            yield* state.putResult({ ...k, afterSeq: end.seq, body: resultBody(cur.fence, outcome, before, [], end.detail ?? "") })
          }
          return
        }
        // A scan stage that staged its result before the crash resumes at the upload stage. The result is
        // the scan's only if it was staged before the target-scan deadline and before the kill began (a
        // kill revokes the record's stage file): a scanner that exits 0 on the deadline's SIGTERM found nothing.
        const found = a.stageFile === null ? { stage: null, damaged: "" } : yield* previouslyStaged(k, a.stageFile)
        const stage = found.stage
        const staged = stage !== null && UnitProtocol.stagedInTime(stage, a.deadlines.scan) ? stage.staged : null
        if (staged !== null) yield* finishThroughUpload(k, classified(staged), "staging", staged)
        else if (PhaseModel.isScanStage(phaseNow) || phaseNow === "assigned") {
          if ((yield* now) >= a.deadlines.scan)
            yield* finishEarly(
              k,
              "timed_out",
              "killed_at_deadline",
              phaseNow,
              `the target-scan deadline passed while ${why.meanwhile}; the scan stage ended during ${phaseNow}` +
                (stage !== null ? `; the result it staged at ${clockIso(deviceClock.toWall(stage.stagedAt))} (this device's wall clock), at or after the deadline, was discarded` : "") +
                found.damaged
            )
          else yield* finishEarly(k, "failed", "scan_error", phaseNow, `${why.during} during ${phaseNow}; the execution unit was lost${found.damaged}`)
        } else {
          // The upload stage began but neither the staged file nor the queued result survived.
          yield* finishEarly(k, "failed", "scan_error", phaseNow, `${why.during} during ${phaseNow}; the staged result was lost${found.damaged}`)
        }
      })

    const damagedResultResumed: Resumed = { during: "its queued result was damaged and set aside", meanwhile: "its queued result was damaged" }
    /** Queues the result of a delivering assignment again after its queued one was set aside as damaged: the scan's own from its stage file, else a scan error. */
    const requeueLostResult = (k: LocalState.Key): Effect.Effect<void, LocalState.StateError | LocalState.JournalRefused> =>
      Effect.gen(function* () {
        const a = yield* state.assignment(k)
        if (a !== null && a.status !== "done") yield* recoverOne(a, damagedResultResumed)
        yield* outbox.notify
      })

    /** Finishes what a previous run of the controller left, in every fleet. */
    const recover = Effect.gen(function* () {
      for (const a of yield* state.assignments({ open: true })) yield* recoverOne(a, restarted)
      for (const s of yield* state.slots) if (s.reservationId !== null) yield* state.putSlot({ ...s, fleetId: null, reservationId: null, updatedAt: yield* now })
    })

    // Retried on a capped exponential schedule with jitter while the server cannot be reached.
    const reachBackoff = Outbox.backoff(200, 5000)

    // The slots the server registered this device with (null when registration was refused or
    // failed): slots claim once registration has ended, and a slot past them never claims.
    const registeredSlots = yield* Deferred.make<number | null>()
    const register = client.register(plan.level).pipe(
      Effect.tapError((e) => (e._tag === "ApiUnreachable" ? emit({ type: "retry", reservationId: 0, message: `registration: ${e.message}` }) : Effect.void)),
      Effect.retry({ schedule: reachBackoff, while: (e) => e._tag === "ApiUnreachable" }),
      Effect.tap((r) =>
        Effect.zipRight(
          Deferred.succeed(registeredSlots, r.device.slots),
          opts.slots > r.device.slots
            ? emit({ type: "error", message: `this device is registered with ${r.device.slots} slot(s) and runs ${opts.slots}: slots ${r.device.slots} to ${opts.slots - 1} stay idle (run it with --slots ${r.device.slots}, or register a device with more)` })
            : Effect.void
        )
      ),
      Effect.flatMap((r) => Effect.zipRight(sawFleet(r.fleetId), emit({ type: "registered", fleetId: r.fleetId, containment: plan.level, at: r.serverNow }))),
      Effect.catchAll((e) => emit({ type: "error", message: `registration ${e._tag === "ApiRefused" ? `refused: ${e.status} ${e.error}: ${e.message}` : `failed: ${e.message}`}` })),
      Effect.ensuring(Deferred.succeed(registeredSlots, null))
    )

    /**
     * One claim: an assignment with the device time its request was sent
     * (each retry measures its own), or null after a refusal or when nothing is pending.
     */
    const claimOnce = (slot: number) => {
      // The last attempt that got no answer: the server may have committed it.
      let unanswered: string | null = null
      // The request itself is not interrupted: an assignment the server issued is run (or released), never dropped.
      return Effect.flatMap(now, (askedAt) => Effect.map(Effect.uninterruptible(client.claim(slot)), (view) => (view === null ? null : { view, askedAt }))).pipe(
        Effect.tapError((e) =>
          e._tag === "ApiUnreachable"
            ? Effect.zipRight(
                Effect.sync(() => (unanswered = e.message)),
                emit({ type: "retry", reservationId: 0, message: `claim for slot ${slot}: ${e.message}` })
              )
            : Effect.void
        ),
        Effect.retry({ schedule: reachBackoff, while: (e) => e._tag === "ApiUnreachable" }),
        Effect.tap(() => Effect.sync(() => unknownHolder.delete(slot))),
        Effect.catchAll((e) =>
          // A slot whose last reservation still awaits its result is busy at the server for a moment; anything else needs an operator.
          e._tag === "ApiRefused" && /slot_busy|capacity/.test(e.error)
            ? Effect.as(e.error.endsWith("slot_busy") ? busyUnknown(slot, e, unanswered) : Effect.void, null)
            : Effect.as(emit({ type: "error", message: `claim for slot ${slot} refused: ${e._tag === "ApiRefused" ? `${e.status} ${e.error}: ` : ""}${e.message}` }), null)
        )
      )
    }

    // Slots the server holds busy for a reservation the local state does not know, already said in the log.
    const unknownHolder = new Set<number>()
    /**
     * A slot the server holds busy while no open assignment of this device is on it, for a reservation
     * the local state has no record of: the answer to this slot's claim was lost after the server
     * committed it (`unanswered`), or the local state lost the reservation (a deleted or replaced state
     * file, a damaged one set aside, a damaged record). Nothing of this device runs it, so the device
     * releases it, naming why, and its target goes back to the queue; the slot claims again at its next
     * poll. A refusal that names no reservation (an older server) or a release that fails leaves the slot
     * idle until the server expires the reservation, said once per slot until it claims again.
     */
    const busyUnknown = (slot: number, refused: Client.ApiRefused, unanswered: string | null) =>
      Effect.gen(function* () {
        const open = yield* Effect.orElseSucceed(state.assignments({ open: true }), () => [])
        if (open.some((a) => a.slot === slot)) return
        const holder = refused.holder
        const fleetId = yield* SubscriptionRef.get(fleet)
        // Released only when the local state can say it has no record of the reservation.
        const unknown =
          holder !== undefined &&
          fleetId !== null &&
          (yield* Effect.orElseSucceed(
            Effect.map(state.assignment({ fleetId, reservationId: holder.reservationId }), (a) => a === null),
            () => false
          ))
        if (!unknown && unknownHolder.has(slot)) return
        const why = yield* whyUnknown(unanswered)
        let releaseFailed = ""
        if (unknown) {
          const detail = `released by its device, whose local state has no record of it: ${why}`
          yield* explainRelease(holder, detail)
          const released = yield* Effect.either(client.release(holder.reservationId, { fence: holder.fence }))
          if (released._tag === "Right") {
            unknownHolder.delete(slot)
            return yield* emit({ type: "released", slot, fleetId, reservationId: holder.reservationId, message: `its local state has no record of it: ${why} Its target goes back to the queue` })
          }
          releaseFailed = ` Releasing it failed (${released.left._tag === "ApiRefused" ? `${released.left.status} ${released.left.error}: ` : ""}${released.left.message}).`
          if (unknownHolder.has(slot)) return
        }
        unknownHolder.add(slot)
        yield* emit({
          type: "error",
          message:
            `slot ${slot} is busy at the server with a reservation this device's local state does not know (${refused.message}); ` +
            `${why}${releaseFailed} The slot stays idle until the server expires that reservation, or an operator cancels it`
        })
      })
    /**
     * Leaves the device's reason on the server's timeline of a reservation it is about to release: a `failed`
     * event after the last one the server has (after an `assigned` one where it has none), where the timeline
     * has room and a legal step to `failed` (best effort: the release goes ahead whatever the server answers).
     */
    const explainRelease = (holder: { readonly reservationId: number; readonly fence: number }, detail: string) =>
      Effect.gen(function* () {
        const seen = yield* Effect.either(client.get(holder.reservationId))
        if (seen._tag === "Left") return
        const v = seen.right
        const at = yield* now
        const events: Array<PhaseModel.Event> =
          v.lastSeq === 0 ? [{ seq: 1, kind: "phase", phase: "assigned", at, detail: `${v.target.source}:${v.target.identity}`.slice(0, 1000) }] : []
        const from = v.lastSeq === 0 ? "assigned" : v.lastPhase
        if (v.state !== "active" || v.fence !== holder.fence || v.lastSeq + events.length >= PhaseModel.maxSeq || !PhaseModel.canTransition(from, "failed")) return
        events.push({ seq: v.lastSeq + events.length + 1, kind: "phase", phase: "failed", at, detail: detail.slice(0, 1000) })
        yield* Effect.ignore(client.progress(holder.reservationId, holder.fence, events))
      })
    /** Why the local state may not know a reservation of this device, as far as it can tell. */
    const whyUnknown = (unanswered: string | null) =>
      Effect.gen(function* () {
        if (unanswered !== null) return `the answer to this slot's claim was lost after the server had taken it (${unanswered}).`
        const reset = yield* Effect.orElseSucceed(state.reset, () => null)
        if (reset !== null) return `the state file was started afresh at ${clockIso(reset.at)}, its damaged predecessor set aside as ${reset.setAsideAs}.`
        const damaged = yield* Effect.orElseSucceed(state.damagedRows(100), () => ({ total: 0, rows: [] }))
        const record = damaged.rows.find((r) => r.table === "assignments")
        if (record !== undefined) return `the record of a reservation of this device (${record.key}) was damaged and set aside at ${clockIso(record.at)}.`
        return "was the state file replaced or deleted?"
      })

    /** Whether a failure is the state's disk being full (SQLite's SQLITE_FULL, the file system's ENOSPC). */
    const diskFull = (cause: Cause.Cause<unknown>): boolean => {
      // The SQLite error sits under the SqlError under the StateError: look down each chain.
      const full = (e: unknown, depth = 0): boolean => {
        if (e === null || typeof e !== "object" || depth > 5) return false
        const { code, message } = e as { code?: unknown; message?: unknown }
        if (code === "SQLITE_FULL" || code === "ENOSPC" || (typeof message === "string" && /database or disk is full|no space left on device/i.test(message))) return true
        return full((e as { cause?: unknown }).cause, depth + 1)
      }
      return [...Cause.failures(cause), ...Cause.defects(cause)].some((e) => full(e))
    }
    const diskFullResumed: Resumed = { during: "a state write failed (the state disk was full)", meanwhile: "the state disk was full" }
    /**
     * A reservation whose state write failed for want of space is not dropped: the slot finishes it as a
     * restart would (its result, or the scan's end), retrying every second until the disk has room again.
     */
    const resumeAfterDiskFull = (slot: number, k: LocalState.Key) =>
      Effect.gen(function* () {
        const a = yield* state.assignment(k)
        if (a !== null && a.status !== "done") yield* recoverOne(a, diskFullResumed)
        yield* state.putSlot({ slot, fleetId: null, reservationId: null, updatedAt: yield* now })
      }).pipe(
        Effect.sandbox,
        Effect.retry({ schedule: Schedule.spaced(Duration.seconds(1)), while: (cause) => diskFull(cause) }),
        Effect.unsandbox,
        Effect.catchAllCause((cause) => emit({ type: "error", message: `slot ${slot}, reservation ${k.reservationId}: ${Cause.pretty(cause)}` }))
      )

    const slotLoop = (slot: number) =>
      Effect.forever(
        Effect.gen(function* () {
          const registered = yield* Deferred.await(registeredSlots)
          // said once, at registration; polling the server with a claim it refuses would say it every poll
          if (registered !== null && slot >= registered) return yield* Effect.never
          if (yield* stateGone) return yield* Effect.never
          const claimed = yield* claimOnce(slot)
          if (claimed === null) return yield* Effect.sleep(pollMs)
          const { view, askedAt } = claimed
          const k: LocalState.Key = { fleetId: view.fleetId, reservationId: view.reservationId }
          yield* Effect.uninterruptible(Effect.zipRight(sawFleet(view.fleetId), execute(slot, view, askedAt))).pipe(
            Effect.catchAllCause((cause) =>
              Cause.isInterruptedOnly(cause)
                ? Effect.failCause(cause)
                : diskFull(cause)
                  ? Effect.zipRight(
                      emit({ type: "error", message: `state disk full: slot ${slot}, reservation ${view.reservationId}: ${Cause.pretty(cause)}; its pending work is retried once there is space` }),
                      resumeAfterDiskFull(slot, k)
                    )
                  : Effect.zipRight(emit({ type: "error", message: `slot ${slot}, reservation ${view.reservationId}: ${Cause.pretty(cause)}` }), Effect.sleep(pollMs))
            )
          )
        })
      )

    yield* recover
    yield* Deferred.succeed(recovered, undefined)
    yield* Effect.forkScoped(register)
    // The fleet key, fetched while the server is reachable, so the upload stage seldom waits for it
    // (it does, retrying, when the key is still unknown: nothing leaves the device unredacted).
    yield* Effect.forkScoped(
      Effect.async<void>((resume, signal) => {
        signal.addEventListener("abort", () => resume(Effect.void))
        redactor.findings([], signal).then(() => resume(Effect.void), () => resume(Effect.void))
      })
    )
    const known = yield* state.slots
    for (let slot = 0; slot < opts.slots; slot++)
      if (!known.some((s) => s.slot === slot)) yield* state.putSlot({ slot, fleetId: null, reservationId: null, updatedAt: yield* now })
    const slots = yield* FiberSet.make()
    for (let slot = 0; slot < opts.slots; slot++) yield* FiberSet.run(slots, slotLoop(slot))
    yield* Effect.addFinalizer(() => Effect.sync(() => stopUnits.abort()))
    return { state, containment: plan, fleet: SubscriptionRef.get(fleet), fatal: Deferred.await(fatal) }
  })

/** A running device, for callers that do not use Effect. */
export interface Device {
  /** The device's local state as Promises. */
  readonly state: LocalState.LocalState
  /** The containment its scan stages run under. */
  readonly containment: Containment.Plan
  /** Stops claiming, ends running units (their reservations are released), flushes the outbox for a while and closes the state. */
  readonly stop: () => Promise<void>
  /** Resolves with the reason once the device cannot go on (see `StateGone`); stop it then. */
  readonly fatal: Promise<StateGone>
}

/**
 * Starts a device and resolves once its slots run: `layer` behind Promises.
 *
 * @example
 * const device = await Supervisor.start({
 *   server: "http://127.0.0.1:8080", token, slots: 2, state: "./worker.db", scanner: Scanner.demo()
 * })
 * process.on("SIGTERM", () => void device.stop())
 */
export const start = async (opts: Options): Promise<Device> => {
  const rt = ManagedRuntime.make(layer(opts))
  const exit = await rt.runPromiseExit(Controller)
  if (Exit.isFailure(exit)) {
    await rt.dispose()
    throw Cause.squash(exit.cause)
  }
  const device = exit.value
  const run = async <A, E>(e: Effect.Effect<A, E>): Promise<A> => {
    const r = await rt.runPromiseExit(e)
    if (Exit.isSuccess(r)) return r.value
    throw Cause.squash(r.cause)
  }
  return {
    state: LocalState.handle(device.state, run, () => Promise.resolve()),
    containment: device.containment,
    // Never settles when the device is stopped first.
    fatal: rt.runPromise(Effect.flip(device.fatal)).catch(() => new Promise<never>(() => {})),
    // Disposing twice closes the scope once.
    stop: () => rt.dispose()
  }
}

/** Whether a refusal means the server no longer holds the reservation for this device (it ended, was cancelled, or the device was revoked). */
const lost = (r: { readonly status: number; readonly error: string }): boolean => r.status === 401 || r.error.startsWith("reservation_refused")

/** Labels the three deadlines of an assignment by meaning, with time remaining at `now` (device clock). */
export const describeDeadlines = (a: LocalState.AssignmentRecord, now: number) => {
  const d = { issuedAt: a.view.issuedAt + a.clockOffsetMs, scanDeadline: a.deadlines.scan, uploadDeadline: a.deadlines.upload, expiresAt: a.deadlines.expiry }
  return {
    rows: (["scanDeadline", "uploadDeadline", "expiresAt"] as const).map((w) => ({ which: w, label: Deadline.labels[w], at: d[w], remainingMs: d[w] - now })),
    next: Deadline.next(d, now)
  }
}
