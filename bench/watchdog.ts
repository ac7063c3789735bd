/**
 * `npm run watchdog [-- --runs 50] [-- --slots 4] [-- --grace-ms 2000] [-- --scan-seconds 4] [-- --containment LEVEL]`
 * (from bench/, after `npm run build` at the root)
 *
 * Watchdog latency: from the target-scan deadline until every process the
 * scan stage started is gone. Every run is a real assignment from a real
 * server (server-example over the in-memory store, on loopback) whose scanner
 * treats SIGTERM as "restart": from the first SIGTERM on it starts a fresh
 * copy of itself in a session of its own every 100 ms, and every copy does
 * the same. The stop setting is the default (SIGTERM, then the kill after the
 * default 2 s grace), so every run pays the full path with copies forking
 * during the grace. The time is the worker's `slot_freed` event (emitted
 * once the unit's box is empty) against the assignment's local target-scan
 * deadline; at that moment every pid the copies recorded is checked in /proc.
 * A run counts when its scanner was running at the deadline (on a loaded
 * machine some are still starting; they are reported, not counted).
 * Prints the median and the maximum, and fails if any process survived or
 * the maximum exceeds grace + 1 s.
 */
import { Config, MemoryStore, Store } from "@scanfleet/core"
import { Server, ServerConfig } from "@scanfleet/server-example"
import { Containment, ProcessTree, Scanner, Supervisor } from "@scanfleet/worker"
import { Layer, ManagedRuntime } from "effect"
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

const args = process.argv.slice(2)
const option = (name: string, fallback: number): number => {
  const i = args.indexOf(`--${name}`)
  const v = i >= 0 ? args[i + 1] : args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3)
  return v === undefined ? fallback : Number(v)
}
const runs = option("runs", 50)
const slots = option("slots", 4)
// The worker's default grace.
const graceMs = option("grace-ms", 2000)
const levelArg = args.find((a) => a.startsWith("--containment="))?.slice("--containment=".length) ?? (args.includes("--containment") ? args[args.indexOf("--containment") + 1] : undefined)
const containment = levelArg === undefined ? undefined : Containment.LevelSchema.parse(levelArg)
// Long enough for every scanner to be running when its deadline fires (a 2-core machine under load starts Node slowly).
const scanSeconds = option("scan-seconds", 4)

const dir = mkdtempSync(join(tmpdir(), "scanfleet-bench-watchdog-"))
const scannerFile = join(dir, "restart-on-term.mjs")
writeFileSync(
  scannerFile,
  `import { spawn } from "node:child_process"
import { appendFileSync, readFileSync } from "node:fs"
// The host's pid (inside a PID namespace process.pid is the namespace's number) and start time, so a recycled pid is not mistaken for it.
const stat = readFileSync("/proc/self/stat", "utf8")
const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
appendFileSync(process.argv[2], stat.split(" ")[0] + " " + fields[19] + "\\n")
let restarting = false
process.on("SIGTERM", () => {
  if (restarting) return
  restarting = true
  const again = () => spawn(process.execPath, [process.argv[1], process.argv[2]], { stdio: "ignore", detached: true }).unref()
  again()
  setInterval(again, 100)
})
setInterval(() => {}, 1000)
`
)

const adminToken = "bench-watchdog-admin-token-0123456789"
const rt = ManagedRuntime.make(
  Server.layer(ServerConfig.make({ adminToken, host: "127.0.0.1", port: 0, logLevel: "none", databaseUrl: "memory:", sweepIntervalMs: 1000 })).pipe(
    Layer.provide(MemoryStore.layer)
  )
)
const info = await rt.runPromise(Server.Info)
const admin = async (path: string, body: unknown): Promise<any> => {
  const res = await fetch(info.url + path, { method: "POST", headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" }, body: JSON.stringify(body) })
  if (res.status >= 300) throw new Error(`${path}: ${res.status} ${await res.text()}`)
  return res.json()
}
const config: Config.ManagedConfig = {
  ...Config.defaults,
  assignments: { globalTtlSeconds: 120, handoffMarginSeconds: 1, overrides: { gitlab: { ttlSeconds: 7200 }, huggingface: { ttlSeconds: 7200 }, dockerhub: { ttlSeconds: 7200 } } },
  sources: { ...Config.defaults.sources, github: { ...Config.defaults.sources.github, scanTimeoutSeconds: scanSeconds, uploadTimeoutSeconds: 30 } }
}
await admin("/v1/admin/config/apply", config)
const device = await admin("/v1/admin/devices", { name: "bench-watchdog", slots })
const store = await rt.runPromise(Store.Store)
// More targets than runs: on a loaded machine a unit may not have its scanner running by its deadline, and such a run does not count.
await rt.runPromise(store.recordObservations(Array.from({ length: runs * 4 }, (_, i) => ({ source: "github" as const, identity: `bench-${i}`, remoteAt: null })), Date.now()))

const latencies: Array<number> = []
/** Pids of a run still alive when its slot was freed. */
let lateSurvivors = 0
/** The processes a run recorded: pid and start time. */
const pidsOf = (f: string) =>
  readFileSync(join(dir, f), "utf8")
    .trim()
    .split("\n")
    .filter(Boolean)
    .map((l) => ({ pid: Number(l.split(" ")[0]), startTime: l.split(" ")[1] }))
const alive = (p: { pid: number; startTime: string }) => {
  const s = ProcessTree.stat(p.pid)
  return s !== null && s.state !== "Z" && s.state !== "X" && s.startTime === p.startTime
}
/** At the moment a run's slot is freed, every process that run started must be dead (its pid file is named after its work folder, which names the reservation). */
const checkRun = (reservationId: number): boolean => {
  const files = readdirSync(dir).filter((f) => f.startsWith(`scanfleet-r${reservationId}-`) && f.endsWith(".pids"))
  for (const f of files) lateSurvivors += pidsOf(f).filter(alive).length
  return files.length > 0
}
/** Runs whose scanner had not started by the deadline (not counted). */
let notStarted = 0
let done!: () => void
const finished = new Promise<void>((r) => (done = r))
const worker = await Supervisor.start({
  server: info.url,
  token: device.token,
  slots,
  // stop is left at its default (SIGTERM, then the kill after the grace).
  scanner: Scanner.command({ name: "restart-on-term", command: process.execPath, args: [scannerFile, "{workDir}.pids"], exitCodes: { "0": "clean" } }),
  ...(containment !== undefined ? { containment } : {}),
  state: join(dir, "worker.db"),
  workRoot: dir,
  graceMs,
  pollMs: 20,
  onEvent: (e) => {
    if (e.type !== "slot_freed" || e.end !== "deadline") return
    if (latencies.length >= runs) return
    if (!checkRun(e.reservationId)) return void notStarted++
    latencies.push(e.at - e.scanDeadline)
    process.stderr.write(`\r${latencies.length}/${runs}`)
    if (latencies.length >= runs) done()
  }
})
await finished
const level = worker.containment.level
await worker.stop()
await rt.dispose()

let survivors = 0
let copies = 0
const files = readdirSync(dir).filter((f) => f.endsWith(".pids"))
for (const f of files) {
  const pids = pidsOf(f)
  copies += pids.length
  survivors += pids.filter(alive).length
}
const started = files.length
rmSync(dir, { recursive: true, force: true })

const sorted = [...latencies].sort((a, b) => a - b)
const median = sorted.length % 2 ? sorted[(sorted.length - 1) / 2] : (sorted[sorted.length / 2 - 1] + sorted[sorted.length / 2]) / 2
process.stderr.write("\n")
console.log(`watchdog: target-scan deadline → every process gone, ${sorted.length} runs of a restart-on-SIGTERM scanner, ${slots} slots, containment ${level}, default stop (SIGTERM, kill after ${graceMs} ms)`)
console.log(`  median ${median.toFixed(0)} ms   max ${sorted.at(-1)} ms   min ${sorted[0]} ms   (bound: grace + 1000 = ${graceMs + 1000} ms)`)
console.log(`  runs counted: ${sorted.length} (scanner running at its deadline); not counted: ${notStarted} (scanner not started yet); scanners started: ${started}; processes they started (restarts during the grace included): ${copies}`)
console.log(`  alive when their slot was freed: ${lateSurvivors}; alive at the end: ${survivors}`)
if (survivors > 0 || lateSurvivors > 0 || (sorted.at(-1) ?? 0) > graceMs + 1000) process.exitCode = 1
