import { SqlClient } from "@effect/sql"
import { Duration, Effect } from "effect"

/**
 * The tables of the newest schema (but the migrations' own), in the order a PostgreSQL migration
 * locks them. A test compares it with the tables the migrations create.
 */
export const tables: ReadonlyArray<string> = [
  "devices",
  "targets",
  "assignments",
  "progress_events",
  "duration_pending",
  "durations",
  "duration_rollups",
  "duration_rollup_deltas",
  "claim_head",
  "policies",
  "config_versions",
  "cycles",
  "fleet",
  "target_retries",
  "cancellations",
  "source_pauses",
  "device_sources",
  "audit_log",
  "leases",
  "findings",
  "finding_scans",
  "finding_events",
  "finding_outbox",
  "finding_cursors",
  "finding_dead_letters"
]

/** How long a PostgreSQL migration waits for the locks of its tables before it gives way and runs again. */
export const lockWait = Duration.seconds(2)

/**
 * PostgreSQL: before each migration, in its transaction, every table that exists is locked at
 * once, waiting at most `lockWait`. Instances of an older build still at work hold these tables
 * while the migration runs; a migration that took one table's lock and then waited for another
 * (an index built on `targets`, then `assignments` altered) deadlocked with their statements,
 * which hold the second and want the first, and was chosen to fail every time. Taken up front,
 * the locks are either all held before any work or the migration gives way at once (the stores
 * run it again: `Migrate.run`), and running statements never wait longer than `lockWait` for it.
 */
export const lockedFirst = (migration: Effect.Effect<void, unknown, SqlClient.SqlClient>) =>
  Effect.zipRight(
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      yield* sql.unsafe(`SET LOCAL lock_timeout = ${Duration.toMillis(lockWait)}`)
      const present = yield* sql<{ name: string }>`
        SELECT t.name FROM unnest(${tables}::text[]) WITH ORDINALITY AS t(name, n) WHERE to_regclass(t.name) IS NOT NULL ORDER BY t.n`
      if (present.length > 0) yield* sql.unsafe(`LOCK TABLE ${present.map((r) => r.name).join(", ")} IN ACCESS EXCLUSIVE MODE`)
    }),
    migration
  )

