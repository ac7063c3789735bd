/**
 * `npm run watchdog [-- --runs 50] [-- --slots 4] [-- --grace-ms 200] [-- --scan-seconds 2]` (from bench/, after `npm run build` at the root)
 *
 * Watchdog latency: from the target-scan deadline to the slot being free
 * again, measured by the worker itself (its `slot_freed` event against the
 * assignment's local target-scan deadline). Every run is a real assignment
 * from a real server (server-example over the in-memory store, on loopback)
 * whose scanner ignores SIGTERM, forks grandchildren that ignore it too and
 * keep stdout open, and never exits; so every run pays the full SIGTERM →
 * grace → SIGKILL path. Prints the median and the maximum, and checks that no
 * process of any scanner tree survived.
 */
import { Config, MemoryStore, Store } from "@scanfleet/core"
import { Server, ServerConfig } from "@scanfleet/server-example"
import { ProcessTree, Scanner, Supervisor } from "@scanfleet/worker"
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
const graceMs = option("grace-ms", 200)
// Long enough for every scanner to be running when its deadline fires (a 2-core machine under load starts Node slowly).
const scanSeconds = option("scan-seconds", 2)

const dir = mkdtempSync(join(tmpdir(), "scanfleet-bench-watchdog-"))
const scannerFile = join(dir, "stubborn.mjs")
writeFileSync(
  scannerFile,
  `import { spawn } from "node:child_process"
import { writeFileSync } from "node:fs"
process.on("SIGTERM", () => {})
const kids = [0, 1].map(() => spawn(process.execPath, ["-e", "process.on('SIGTERM', () => {}); setInterval(() => {}, 1000)"], { stdio: ["ignore", "inherit", "inherit"] }))
writeFileSync(process.argv[2], [process.pid, ...kids.map((k) => k.pid)].join("\\n"))
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
await rt.runPromise(store.recordObservations(Array.from({ length: runs }, (_, i) => ({ source: "github" as const, identity: `bench-${i}`, remoteAt: null })), Date.now()))

const latencies: Array<number> = []
let done!: () => void
const finished = new Promise<void>((r) => (done = r))
const worker = await Supervisor.start({
  server: info.url,
  token: device.token,
  slots,
  scanner: Scanner.command({ name: "stubborn", command: process.execPath, args: [scannerFile, join(dir, "{identity}.pids")], exitCodes: { "0": "clean" } }),
  state: join(dir, "worker.db"),
  workRoot: dir,
  graceMs,
  pollMs: 20,
  onEvent: (e) => {
    if (e.type !== "slot_freed" || e.end !== "deadline") return
    latencies.push(e.at - e.scanDeadline)
    process.stderr.write(`\r${latencies.length}/${runs}`)
    if (latencies.length >= runs) done()
  }
})
await finished
await worker.stop()
await rt.dispose()

let survivors = 0
for (const f of readdirSync(dir).filter((f) => f.endsWith(".pids")))
  for (const pid of readFileSync(join(dir, f), "utf8").trim().split("\n").map(Number)) {
    const s = ProcessTree.stat(pid)
    if (s !== null && s.state !== "Z") survivors++
  }
const started = readdirSync(dir).filter((f) => f.endsWith(".pids")).length
rmSync(dir, { recursive: true, force: true })

const sorted = [...latencies].sort((a, b) => a - b)
const median = sorted.length % 2 ? sorted[(sorted.length - 1) / 2] : (sorted[sorted.length / 2 - 1] + sorted[sorted.length / 2]) / 2
process.stderr.write("\n")
console.log(`watchdog: target-scan deadline → free slot, ${sorted.length} runs, ${slots} slots, SIGTERM grace ${graceMs} ms`)
console.log(`  median ${median.toFixed(0)} ms   max ${sorted.at(-1)} ms   min ${sorted[0]} ms   (bound: grace + 1000 = ${graceMs + 1000} ms)`)
console.log(`  scanners running at their deadline: ${started} of ${sorted.length}; surviving scanner processes: ${survivors}`)
if (survivors > 0 || (sorted.at(-1) ?? 0) > graceMs + 1000) process.exitCode = 1
