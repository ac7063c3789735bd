// `npm start`: the whole scanfleet fleet on one machine. See docs/getting-started.md.
import { createWriteStream, mkdirSync, readFileSync } from "node:fs"
import { join, relative, resolve } from "node:path"
import { format } from "node:util"
import { LogLine } from "@scanfleet/core"
import * as Demo from "./Demo.js"
import * as Summary from "./Summary.js"

const usage = `npm start [-- options]

Runs the scanfleet demo fleet: the server, discovery against local stand-ins of
GitHub, GitLab, HuggingFace and DockerHub, and two worker devices. Ctrl-C stops it.

Options (each also an environment variable):
  --data DIR         data folder (SCANFLEET_DEMO_DATA, default .data/demo)
  --port PORT        server port, 0 for a free one (SCANFLEET_DEMO_PORT, default 8080)
  --host HOST        listen address (SCANFLEET_HOST, default 127.0.0.1)
  --database URL     sqlite:<path> or postgres://... (SCANFLEET_DATABASE_URL, default sqlite:<data>/scanfleet.db)
  --sources FILE     discover from the public APIs listed in FILE instead of the local stand-ins
                     (SCANFLEET_DEMO_SOURCES; tokens from GITHUB_TOKEN, GITLAB_TOKEN, HF_TOKEN,
                     DOCKERHUB_USERNAME and DOCKERHUB_TOKEN)`

const fail = (message: string, code = 2): never => {
  process.stderr.write(`${message}\n`)
  process.exit(code)
}

const flags = new Map<string, string>()
const argv = process.argv.slice(2)
for (let i = 0; i < argv.length; i++) {
  const a = argv[i]
  if (a === "--help" || a === "-h") {
    process.stdout.write(`${usage}\n`)
    process.exit(0)
  }
  if (!a.startsWith("--")) fail(`unexpected argument: ${a}\n\n${usage}`)
  const eq = a.indexOf("=")
  if (eq > 0) flags.set(a.slice(2, eq), a.slice(eq + 1))
  else if (argv[i + 1] === undefined) fail(`${a} needs a value\n\n${usage}`)
  else flags.set(a.slice(2), argv[++i])
}
for (const k of flags.keys()) if (!["data", "port", "host", "database", "sources"].includes(k)) fail(`unknown option --${k}\n\n${usage}`)

const env = process.env
const dataDir = resolve(flags.get("data") ?? env.SCANFLEET_DEMO_DATA ?? ".data/demo")
const portText = flags.get("port") ?? env.SCANFLEET_DEMO_PORT
const port = portText === undefined ? 8080 : Number(portText)
if (!Number.isInteger(port) || port < 0 || port > 65_535) fail(`the port must be an integer from 0 to 65535, not ${portText}`)
const sourcesFile = flags.get("sources") ?? env.SCANFLEET_DEMO_SOURCES
let sources: Demo.Options["sources"] = { kind: "fake" }
if (sourcesFile) {
  let parsed: ReturnType<typeof Demo.PublicSourcesSchema.safeParse>
  try {
    parsed = Demo.PublicSourcesSchema.safeParse(JSON.parse(readFileSync(sourcesFile, "utf8")))
  } catch (e) {
    fail(`cannot read the sources file ${sourcesFile}: ${(e as Error).message}`)
    throw e
  }
  if (!parsed.success) fail(`the sources file ${sourcesFile} is invalid:\n${parsed.error.issues.map((i) => `  ${i.path.join(".") || "(root)"}: ${i.message}`).join("\n")}`)
  else sources = { kind: "public", settings: parsed.data, env }
}

// The terminal belongs to the summary: everything the libraries print (JSON
// logs, cycle lines) goes to the log file in the data folder.
mkdirSync(dataDir, { recursive: true })
const logFile = join(dataDir, "demo.log")
const logStream = createWriteStream(logFile, { flags: "a" })
// The newest error-level line of the one log schema, whoever wrote it, for the summary.
let lastErrorLine: { readonly at: number; readonly text: string } | null = null
const write = (text: string) => {
  for (const line of text.split("\n")) {
    const e = LogLine.parse(line)
    if (e && (e.level === "error" || e.level === "fatal"))
      lastErrorLine = { at: e.time, text: [e.message, ...["error", "cause", "device", "source"].filter((k) => e.fields[k] !== undefined).map((k) => `${k}=${String(e.fields[k]).split("\n")[0]}`)].join(" ") }
  }
  logStream.write(`${text}\n`)
}
const toLog = (...args: Array<unknown>) => write(format(...args))
for (const m of ["log", "info", "warn", "error", "debug"] as const) console[m] = toLog

// A terminal that went away must not crash the shutdown that follows.
process.stdout.on("error", () => {})
const out = Summary.printer(process.stdout)
const shown = (p: string) => {
  const r = relative(process.cwd(), p)
  return r.startsWith("..") ? p : r
}

const startAt = (p: number) =>
  Demo.start({
    dataDir,
    port: p,
    ...(flags.get("host") ?? env.SCANFLEET_HOST ? { host: flags.get("host") ?? env.SCANFLEET_HOST } : {}),
    ...(flags.get("database") ?? env.SCANFLEET_DATABASE_URL ? { databaseUrl: flags.get("database") ?? env.SCANFLEET_DATABASE_URL } : {}),
    ...(env.SCANFLEET_ADMIN_TOKEN ? { adminToken: env.SCANFLEET_ADMIN_TOKEN } : {}),
    sources,
    log: write
  })

let demo: Demo.Running
try {
  demo = await startAt(port).catch(async (e: unknown) => {
    // The default port is taken: a free one is as good for a demo. An explicit port is the user's to fix.
    if (portText === undefined && /EADDRINUSE/.test(String(e) + String((e as { cause?: unknown }).cause))) return startAt(0)
    throw e
  })
} catch (e) {
  const message = e instanceof Error ? e.message : String(e)
  fail(`the demo could not start: ${message}\n(details in ${shown(logFile)})`, 1)
  throw e
}

out.note(
  [
    `scanfleet demo, run ${demo.run} in ${shown(dataDir)} (database ${demo.databaseUrl}; ${sources.kind === "fake" ? "local stand-ins of GitHub, GitLab, HuggingFace and DockerHub" : "the public APIs"})`,
    `Dashboard: ${demo.dashboardUrl}`,
    `Admin API: curl -H "Authorization: Bearer ${demo.adminToken}" ${demo.url}/v1/admin/summary`,
    `Logs: ${shown(logFile)}   Stop: Ctrl-C`,
    ""
  ].join("\n")
)

let stopping = false
const refresh = async () => {
  if (stopping) return
  try {
    const [s, sources] = await Promise.all([demo.summary(), demo.sourceErrors()])
    if (!stopping) out.show(s, Date.now(), { sources, lastErrorLine })
  } catch (e) {
    toLog("summary failed", e)
  }
}
await refresh()
const timer = setInterval(() => void refresh(), 1000)

const shutdown = (signal: NodeJS.Signals) => {
  if (stopping) return
  stopping = true
  clearInterval(timer)
  out.note(`${signal}: stopping the workers, the scheduler and the server...`)
  // A shutdown that hangs still ends: the workers' scanner groups are killed long before this.
  const force = setTimeout(() => {
    const waiting = demo.stopping().map((s) => `${s.step} (${s.ms} ms)`)
    process.stderr.write(`the demo did not stop within 30 s${waiting.length ? `; still waiting for: ${waiting.join(", ")}` : ""}; exiting anyway\n`)
    process.exit(1)
  }, 30_000)
  force.unref()
  demo
    .stop()
    .then(
      () => {
        out.note("stopped.")
        logStream.end(() => process.exit(0))
      },
      (e: unknown) => {
        process.stderr.write(`stopping failed: ${e instanceof Error ? e.message : String(e)}\n`)
        process.exit(1)
      }
    )
}
process.on("SIGINT", shutdown)
process.on("SIGTERM", shutdown)
// A closed terminal stops the fleet just as cleanly: no scanner is left running without its controller.
process.on("SIGHUP", shutdown)
