import { Command, Options } from "@effect/cli"
import { Config, Effect, Option, Redacted } from "effect"
import { existsSync, readFileSync } from "node:fs"
import { isAbsolute, resolve } from "node:path"
import { LogLine } from "@scanfleet/core"
import pkg from "../package.json" with { type: "json" }
import * as CommandLine from "./CommandLine.js"
import * as DeviceClock from "./DeviceClock.js"
import * as LocalState from "./LocalState.js"
import * as Scanner from "./Scanner.js"
import * as Status from "./Status.js"
import * as Supervisor from "./Supervisor.js"

/**
 * The `scanfleet-worker` command: `run` a device, print its `status` (slots,
 * phases, the three labelled deadlines and the time left) or its `history`
 * (each assignment's journal, as sent and as kept locally).
 */

const scannerHelp = `SCANNER is one of: demo[:slowMarker] (the built-in demo scanner); trufflehog (its exit-code table: 183 = findings, SIGKILL only); gitleaks (over a clone of GitHub and GitLab targets: 42 = findings); command:FILE.json (a command scanner described by a JSON file); module:FILE.js (a module exporting a runner function as its default export)`

/** Parses a `--scanner` value into a scanner spec. */
export const parseScanner = (value: string, cwd: string): Scanner.ParsedSpec => {
  if (value === "demo" || value.startsWith("demo:")) return Scanner.demo(value.startsWith("demo:") ? { slowMarker: value.slice(5) } : {})
  if (value === "trufflehog") return Scanner.trufflehog()
  if (value === "gitleaks") return Scanner.gitleaks()
  if (value.startsWith("command:")) {
    const file = resolve(cwd, value.slice(8))
    return Scanner.CommandSpecSchema.parse({ kind: "command", ...JSON.parse(readFileSync(file, "utf8")) })
  }
  if (value.startsWith("module:")) {
    const file = value.slice(7)
    return Scanner.runnerModule({ name: "module", module: isAbsolute(file) ? file : resolve(cwd, file) })
  }
  throw new Error(`unknown scanner "${value}". ${scannerHelp}`)
}

/**
 * Renders the `status` view of a state file at `now` on its device clock, times shown on the wall clock
 * `wallOffsetMs` away (see `Status.read` for the same as data).
 */
export const renderStatus = async (state: LocalState.LocalState, now: number, wallOffsetMs = 0): Promise<string> => Status.render(await Status.read(state, now, wallOffsetMs))

/** Renders the `history` view: assignments with their journals, times shown on the wall clock as in `renderStatus`. */
export const renderHistory = async (
  state: LocalState.LocalState,
  q: { readonly reservationId?: number; readonly limit: number },
  now: number,
  wallOffsetMs = 0
): Promise<string> => {
  const out: Array<string> = []
  const list = q.reservationId !== undefined ? [await state.assignment(q.reservationId)].filter((a) => a !== null) : await state.assignments({ limit: q.limit })
  for (const a of list) {
    out.push(`reservation ${a.reservationId} ${a.view.target.source}:${a.view.target.identity} slot ${a.slot} fleet ${a.fleetId} — ${a.status}${a.outcome ? `, outcome ${a.outcome}` : ""}${a.finalPhase ? ` (final phase ${a.finalPhase})` : ""}${a.receipt ? `, receipt ${a.receipt.receiptId}` : ""}`)
    out.push(...Status.describe(Status.line(a, now), wallOffsetMs))
    for (const e of await state.journal(a)) {
      const kind = e.kind === "recovered" ? "recovered in" : "entered"
      // a refused event says why, as a refused result does
      out.push(`  #${String(e.seq).padStart(3)} ${Status.wallIso(e.at, wallOffsetMs)} ${kind} ${e.phase}  [${e.delivery}]${e.error ? ` ${e.error}` : ""}${e.detail ? `  ${e.detail}` : ""}`)
    }
    const r = await state.result(a)
    if (r?.kind === "result") out.push(`  result after #${r.afterSeq}: ${r.body.outcome}, ${r.body.findings.length} finding(s) [${r.delivery}]${r.error ? ` ${r.error}` : ""}`)
    if (r?.kind === "release") out.push(`  release after #${r.afterSeq} [${r.delivery}]${r.error ? ` ${r.error}` : ""}`)
    out.push("")
  }
  return out.join("\n")
}


/** The device's events as lines of the one log schema (errors and retries at their own levels). */
export const eventLogger = Supervisor.eventLogger

// Every setting has a flag and an environment variable; the help names both.
const setting = <A>(o: Options.Options<A>, env: string, config: Config.Config<A>, what: string) =>
  o.pipe(Options.withDescription(`${what} (env ${env})`), Options.withFallbackConfig(config), Options.optional)
const text = (name: string, env: string, what: string) => setting(Options.text(name), env, Config.string(env), what)
const integer = (name: string, env: string, what: string) => setting(Options.integer(name), env, Config.integer(env), what)

const stateOption = text("state", "SCANFLEET_STATE", "the device's local state file (default ./scanfleet-worker.db)")
const stateFile = (o: Option.Option<string>) => Option.getOrElse(o, () => "./scanfleet-worker.db")

const nonNegative = (name: string, v: Option.Option<number>, fallback: number) =>
  Option.match(v, {
    onNone: () => Effect.succeed(fallback),
    onSome: (n) => (n >= 0 ? Effect.succeed(n) : Effect.fail(new CommandLine.UsageError({ message: `--${name} must be a non-negative integer, not ${n}` })))
  })

/**
 * Read-only commands open an existing state file only: a typo must not create an empty one. A state file
 * they cannot use (damaged, unreadable) is refused with the reason; setting a damaged one aside is the
 * controller's, which holds the file's lock.
 */
const openExisting = (file: string) =>
  Effect.acquireRelease(
    existsSync(file)
      ? Effect.tryPromise({ try: () => LocalState.open(file), catch: (e) => e }).pipe(
          Effect.catchAll((e) => (e instanceof LocalState.StateError ? Effect.fail(new CommandLine.CommandFailed({ message: e.message })) : Effect.die(e)))
        )
      : Effect.fail(new CommandLine.CommandFailed({ message: `no state file at ${file} (it is written by 'scanfleet-worker run'; pass --state FILE or set SCANFLEET_STATE)` })),
    (state) => Effect.promise(() => state.close())
  )

/**
 * A state file's device clock, read once for a view: now on it, and the wall clock minus it. The file keeps
 * device-clock times, which a wall-clock step since the boot's anchor sets apart from the wall clock.
 */
const viewClock = (file: string): { readonly now: number; readonly wallOffsetMs: number } => {
  const now = DeviceClock.readState(file).now()
  return { now, wallOffsetMs: Date.now() - now }
}

const status = Command.make("status", { state: stateOption }, ({ state }) =>
  Effect.scoped(
    Effect.flatMap(openExisting(stateFile(state)), (s) => {
      const clock = viewClock(stateFile(state))
      return Effect.flatMap(Effect.promise(() => renderStatus(s, clock.now, clock.wallOffsetMs)), CommandLine.print)
    })
  )
).pipe(Command.withDescription("print each slot's assignment, phase, the three labelled deadlines and the time left"))

const history = Command.make(
  "history",
  {
    state: stateOption,
    reservation: integer("reservation", "SCANFLEET_RESERVATION", "only this reservation"),
    limit: integer("limit", "SCANFLEET_HISTORY_LIMIT", "how many assignments, newest first (default 20)")
  },
  ({ state, reservation, limit }) =>
    Effect.scoped(
      Effect.gen(function* () {
        const s = yield* openExisting(stateFile(state))
        const n = yield* nonNegative("limit", limit, 20)
        const q = Option.match(reservation, { onNone: () => ({ limit: n }), onSome: (reservationId) => ({ reservationId, limit: n }) })
        const clock = viewClock(stateFile(state))
        yield* CommandLine.print(yield* Effect.promise(() => renderHistory(s, q, clock.now, clock.wallOffsetMs)))
      })
    )
).pipe(Command.withDescription("print each assignment's journal, as sent and as kept locally"))

const runCommand = Command.make(
  "run",
  {
    server: text("server", "SCANFLEET_SERVER", "the scanfleet server's URL"),
    token: setting(Options.redacted("token"), "SCANFLEET_TOKEN", Config.redacted("SCANFLEET_TOKEN"), "the device token 'scanfleet-server device add' printed"),
    slots: integer("slots", "SCANFLEET_SLOTS", "slots run at once (default 1)"),
    scanner: text("scanner", "SCANFLEET_SCANNER", scannerHelp),
    state: stateOption,
    permits: integer("permits", "SCANFLEET_PERMITS", "scan permits (default: the slots)"),
    graceMs: integer("grace-ms", "SCANFLEET_GRACE_MS", "how long a scanner has between SIGTERM and SIGKILL (default 2000)"),
    pollMs: integer("poll-ms", "SCANFLEET_POLL_MS", "how often an idle slot asks for work (default 1000)"),
    logFormat: setting(Options.choice("log-format", LogLine.formats), "SCANFLEET_LOG_FORMAT", Config.literal(...LogLine.formats)(), "json lines, or pretty for people (default json)")
  },
  (o) =>
    Effect.gen(function* () {
      const server = yield* CommandLine.required(o.server, "--server URL", "SCANFLEET_SERVER")
      const protocol = (() => {
        try {
          return new URL(server).protocol
        } catch {
          return ""
        }
      })()
      if (protocol !== "http:" && protocol !== "https:")
        return yield* new CommandLine.UsageError({ message: `--server (or SCANFLEET_SERVER) must be an http:// or https:// URL, got ${JSON.stringify(server.slice(0, 200))}` })
      const token = yield* CommandLine.required(o.token, "--token TOKEN", "SCANFLEET_TOKEN")
      const scannerValue = yield* CommandLine.required(o.scanner, "--scanner SCANNER", "SCANFLEET_SCANNER")
      const slots = yield* nonNegative("slots", o.slots, 1)
      if (slots < 1) return yield* new CommandLine.UsageError({ message: "--slots must be at least 1" })
      const permits = yield* nonNegative("permits", o.permits, slots)
      const scanner = yield* Effect.try({ try: () => parseScanner(scannerValue, process.cwd()), catch: (e) => new CommandLine.UsageError({ message: `--scanner: ${(e as Error).message}` }) })
      const state = stateFile(o.state)
      const options = {
        server,
        token: Redacted.value(token),
        slots,
        scanner,
        state,
        permits,
        graceMs: yield* nonNegative("grace-ms", o.graceMs, 2000),
        pollMs: yield* nonNegative("poll-ms", o.pollMs, 1000),
        onEvent: eventLogger(Option.getOrElse(o.logFormat, () => "json" as const), (line) => process.stderr.write(`${line}\n`))
      }
      const device = yield* Effect.acquireRelease(
        Effect.promise(() => Supervisor.start(options)),
        (device) => Effect.zipRight(Effect.logInfo("stopping"), Effect.promise(() => device.stop()))
      )
      // The containment level is named at start: a device that fell back to a weaker level says so.
      yield* Effect.logInfo(`worker started, containment ${device.containment.level}`).pipe(Effect.annotateLogs({ slots, server, state, containment: device.containment.level }))
      // A device that cannot go on ends the command with its reason, so a service manager restarts it.
      const gone = yield* Effect.promise(() => device.fatal)
      return yield* new CommandLine.CommandFailed({ message: gone.message })
    }).pipe(Effect.scoped, Effect.provide(CommandLine.logger(Option.getOrElse(o.logFormat, () => "json" as const))))
).pipe(Command.withDescription("run a device: claim assignments, supervise the scanner, deliver progress and results"))

/** The `scanfleet-worker` command tree. */
export const command = Command.make("scanfleet-worker").pipe(
  Command.withDescription("a scanfleet worker device"),
  Command.withSubcommands([runCommand, status, history])
)

/** The version the command reports. */
export const version: string = pkg.version

/** Runs the CLI with arguments (without `node` and the script); resolves to an exit code. */
export const main = (argv: ReadonlyArray<string>, io: CommandLine.Io = CommandLine.processIo): Promise<number> =>
  CommandLine.run({ name: "scanfleet-worker", version, command }, argv, io)
