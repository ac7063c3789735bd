import { Migrator, type SqlClient, type SqlError } from "@effect/sql"
import { Effect } from "effect"
import { lockedFirst } from "./internal/MigrationLocks.js"
import pg0001 from "./migrations/pg/0001_queue.js"
import pg0002 from "./migrations/pg/0002_history.js"
import pg0003 from "./migrations/pg/0003_vacuum.js"
import pg0004 from "./migrations/pg/0004_device_active.js"
import pg0005 from "./migrations/pg/0005_duration_rollups.js"
import pg0006 from "./migrations/pg/0006_lean_results.js"
import pg0007 from "./migrations/pg/0007_fleet.js"
import pg0008 from "./migrations/pg/0008_operations.js"
import pg0009 from "./migrations/pg/0009_findings.js"
import pg0010 from "./migrations/pg/0010_priority.js"
import pg0011 from "./migrations/pg/0011_lean_hot_path.js"
import pg0012 from "./migrations/pg/0012_policy_ref.js"
import pg0013 from "./migrations/pg/0013_claim_head.js"
import pg0014 from "./migrations/pg/0014_no_history_references.js"
import pg0015 from "./migrations/pg/0015_expiry_index_apart.js"
import pg0016 from "./migrations/pg/0016_rollups_by_start.js"
import pg0017 from "./migrations/pg/0017_windows_by_start.js"
import pg0018 from "./migrations/pg/0018_findings_key_hashed.js"
import sqlite0001 from "./migrations/sqlite/0001_queue.js"
import sqlite0002 from "./migrations/sqlite/0002_history.js"
import sqlite0003 from "./migrations/sqlite/0003_vacuum.js"
import sqlite0004 from "./migrations/sqlite/0004_device_active.js"
import sqlite0005 from "./migrations/sqlite/0005_duration_rollups.js"
import sqlite0006 from "./migrations/sqlite/0006_lean_results.js"
import sqlite0007 from "./migrations/sqlite/0007_fleet.js"
import sqlite0008 from "./migrations/sqlite/0008_operations.js"
import sqlite0009 from "./migrations/sqlite/0009_findings.js"
import sqlite0010 from "./migrations/sqlite/0010_priority.js"
import sqlite0011 from "./migrations/sqlite/0011_lean_hot_path.js"
import sqlite0012 from "./migrations/sqlite/0012_policy_ref.js"
import sqlite0013 from "./migrations/sqlite/0013_claim_head.js"
import sqlite0014 from "./migrations/sqlite/0014_no_history_references.js"
import sqlite0015 from "./migrations/sqlite/0015_expiry_index_apart.js"
import sqlite0016 from "./migrations/sqlite/0016_rollups_by_start.js"
import sqlite0017 from "./migrations/sqlite/0017_windows_by_start.js"
import sqlite0018 from "./migrations/sqlite/0018_findings_key_hashed.js"

/** The SQL dialects scanfleet ships migrations for. */
export type Dialect = "pg" | "sqlite"

/** The table that records which migrations ran. */
export const table = "scanfleet_migrations"

// Static imports, so a bundle carries its migrations and never reads the file system.
const migrations: Record<Dialect, Record<string, Effect.Effect<void, unknown, SqlClient.SqlClient>>> = {
  pg: { "0001_queue": pg0001, "0002_history": pg0002, "0003_vacuum": pg0003, "0004_device_active": pg0004, "0005_duration_rollups": pg0005, "0006_lean_results": pg0006, "0007_fleet": pg0007, "0008_operations": pg0008, "0009_findings": pg0009, "0010_priority": pg0010, "0011_lean_hot_path": pg0011, "0012_policy_ref": pg0012, "0013_claim_head": pg0013, "0014_no_history_references": pg0014, "0015_expiry_index_apart": pg0015, "0016_rollups_by_start": pg0016, "0017_windows_by_start": pg0017, "0018_findings_key_hashed": pg0018 },
  sqlite: { "0001_queue": sqlite0001, "0002_history": sqlite0002, "0003_vacuum": sqlite0003, "0004_device_active": sqlite0004, "0005_duration_rollups": sqlite0005, "0006_lean_results": sqlite0006, "0007_fleet": sqlite0007, "0008_operations": sqlite0008, "0009_findings": sqlite0009, "0010_priority": sqlite0010, "0011_lean_hot_path": sqlite0011, "0012_policy_ref": sqlite0012, "0013_claim_head": sqlite0013, "0014_no_history_references": sqlite0014, "0015_expiry_index_apart": sqlite0015, "0016_rollups_by_start": sqlite0016, "0017_windows_by_start": sqlite0017, "0018_findings_key_hashed": sqlite0018 }
}

/** The migration ids of a dialect, in order (both dialects share one list). */
export const ids = (dialect: Dialect): ReadonlyArray<string> => Object.keys(migrations[dialect]).sort()

/** The newest schema version this build knows. */
export const latest: number = Math.max(...ids("pg").map((id) => Number(id.slice(0, 4))))

/**
 * Runs the forward-only migrations of a dialect that have not run yet, in one transaction; returns
 * those it ran as `[id, name]`. On PostgreSQL each first locks every table it may touch, waiting at
 * most two seconds (a failure on a lock, `55P03` or `40P01`, may be run again).
 *
 * @example
 * yield* Migrator.migrate("sqlite")
 */
export const migrate = (
  dialect: Dialect
): Effect.Effect<ReadonlyArray<readonly [id: number, name: string]>, Migrator.MigrationError | SqlError.SqlError, SqlClient.SqlClient> =>
  Migrator.make({})({ loader: Migrator.fromRecord(dialect === "pg" ? lockingFirst : migrations.sqlite), table })

// PostgreSQL's migrations, each taking its tables' locks first (`MigrationLocks.lockedFirst`).
const lockingFirst = Object.fromEntries(Object.entries(migrations.pg).map(([id, m]) => [id, lockedFirst(m)]))
