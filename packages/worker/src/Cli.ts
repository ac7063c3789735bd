import { readFileSync } from "node:fs"
import { isAbsolute, resolve } from "node:path"
import { parseArgs } from "node:util"
import * as LocalState from "./LocalState.js"
import * as Scanner from "./Scanner.js"
import * as Status from "./Status.js"
import * as Supervisor from "./Supervisor.js"

/**
 * The `scanfleet-worker` command: `run` a device, print its `status` (slots,
 * phases, the three labelled deadlines and the time left) or its `history`
 * (each assignment's journal, as sent and as kept locally).
 */

const usage = `usage:
  scanfleet-worker run --server URL --token TOKEN --slots N --scanner SCANNER --state FILE
                       [--permits N] [--grace-ms MS] [--poll-ms MS]
  scanfleet-worker status --state FILE
  scanfleet-worker history --state FILE [--reservation ID] [--limit N]

SCANNER is one of:
  demo[:slowMarker]       the built-in demo scanner
  trufflehog              trufflehog with its exit-code table (183 = findings, SIGKILL only)
  gitleaks                gitleaks over a clone of GitHub and GitLab targets (42 = findings)
  command:FILE.json       a command scanner described by a JSON file
  module:FILE.js          a module exporting a runner function (export default)
The token may also come from SCANFLEET_TOKEN.`

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
  throw new Error(`unknown scanner "${value}"\n${usage}`)
}

/** Renders the `status` view of a state file at `now` (see `Status.read` for the same as data). */
export const renderStatus = async (state: LocalState.LocalState, now: number): Promise<string> => Status.render(await Status.read(state, now))

const describe = (a: LocalState.AssignmentRecord, now: number): Array<string> => Status.describe(Status.line(a, now))

/** Renders the `history` view: assignments with their journals. */
export const renderHistory = async (state: LocalState.LocalState, q: { readonly reservationId?: number; readonly limit: number }, now: number): Promise<string> => {
  const out: Array<string> = []
  const list = q.reservationId !== undefined ? [await state.assignment(q.reservationId)].filter((a) => a !== null) : await state.assignments({ limit: q.limit })
  for (const a of list) {
    out.push(`reservation ${a.reservationId} ${a.view.target.source}:${a.view.target.identity} slot ${a.slot} fleet ${a.fleetId} — ${a.status}${a.outcome ? `, outcome ${a.outcome}` : ""}${a.finalPhase ? ` (final phase ${a.finalPhase})` : ""}${a.receipt ? `, receipt ${a.receipt.receiptId}` : ""}`)
    out.push(...describe(a, now))
    for (const e of await state.journal(a)) {
      const kind = e.kind === "recovered" ? "recovered in" : "entered"
      out.push(`  #${String(e.seq).padStart(3)} ${new Date(e.at).toISOString()} ${kind} ${e.phase}  [${e.delivery}]${e.detail ? `  ${e.detail}` : ""}`)
    }
    const r = await state.result(a)
    if (r?.kind === "result") out.push(`  result after #${r.afterSeq}: ${r.body.outcome}, ${r.body.findings.length} finding(s) [${r.delivery}]${r.error ? ` ${r.error}` : ""}`)
    if (r?.kind === "release") out.push(`  release after #${r.afterSeq} [${r.delivery}]${r.error ? ` ${r.error}` : ""}`)
    out.push("")
  }
  return out.join("\n")
}

/** Runs the CLI with arguments (without `node` and the script); resolves to an exit code. */
export const main = async (argv: ReadonlyArray<string>, io: { readonly out: (s: string) => void; readonly err: (s: string) => void } = { out: (s) => process.stdout.write(s), err: (s) => process.stderr.write(s) }): Promise<number> => {
  const [cmd, ...rest] = argv
  let values: Record<string, string | undefined>
  try {
    ;({ values } = parseArgs({
      args: [...rest],
      options: {
        server: { type: "string" },
        token: { type: "string" },
        slots: { type: "string" },
        scanner: { type: "string" },
        state: { type: "string" },
        permits: { type: "string" },
        "grace-ms": { type: "string" },
        "poll-ms": { type: "string" },
        reservation: { type: "string" },
        limit: { type: "string" }
      }
    }) as { values: Record<string, string | undefined> })
  } catch (e) {
    io.err(`${(e as Error).message}\n${usage}\n`)
    return 2
  }
  const stateFile = values.state ?? "./scanfleet-worker.db"
  const int = (name: string, fallback: number) => {
    const v = values[name]
    if (v === undefined) return fallback
    const n = Number(v)
    if (!Number.isInteger(n) || n < 0) throw new Error(`--${name} must be a non-negative integer, not "${v}"`)
    return n
  }
  try {
    switch (cmd) {
      case "status": {
        const state = await LocalState.open(stateFile)
        io.out(`${await renderStatus(state, Date.now())}\n`)
        await state.close()
        return 0
      }
      case "history": {
        const state = await LocalState.open(stateFile)
        const reservation = values.reservation !== undefined ? int("reservation", 0) : undefined
        io.out(`${await renderHistory(state, { ...(reservation !== undefined ? { reservationId: reservation } : {}), limit: int("limit", 20) }, Date.now())}\n`)
        await state.close()
        return 0
      }
      case "run": {
        const token = values.token ?? process.env.SCANFLEET_TOKEN
        if (!values.server || !token || !values.scanner) throw new Error(`run needs --server, --token (or SCANFLEET_TOKEN) and --scanner\n${usage}`)
        const slots = int("slots", 1)
        const device = await Supervisor.start({
          server: values.server,
          token,
          slots,
          scanner: parseScanner(values.scanner, process.cwd()),
          state: stateFile,
          permits: int("permits", slots),
          graceMs: int("grace-ms", 2000),
          pollMs: int("poll-ms", 1000)
        })
        io.err(`scanfleet-worker: ${slots} slot(s) against ${values.server}, state in ${stateFile}, containment ${device.containment.level}\n`)
        await new Promise<void>((resolveStop) => {
          const onSignal = (sig: NodeJS.Signals) => {
            process.off("SIGINT", onSignal)
            process.off("SIGTERM", onSignal)
            io.err(`scanfleet-worker: ${sig}, stopping\n`)
            void device.stop().then(resolveStop)
          }
          process.on("SIGINT", onSignal)
          process.on("SIGTERM", onSignal)
        })
        return 0
      }
      default:
        io.err(`${usage}\n`)
        return cmd === undefined || cmd === "help" || cmd === "--help" ? 0 : 2
    }
  } catch (e) {
    io.err(`scanfleet-worker: ${(e as Error).message}\n`)
    return 1
  }
}
