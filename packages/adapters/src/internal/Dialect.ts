import type { SqlClient, SqlError, Statement } from "@effect/sql"
import { Effect } from "effect"

/**
 * What differs between the SQL dialects in the statements the Store shares, chosen
 * once per client (`sql.onDialectOrElse`). The operations whose whole statements
 * differ are chosen by `name`, once, where the Store is built; a dialect module with
 * native hot paths (SQLite's prepared statements) replaces those operations in its
 * own Store layer.
 */
export interface Dialect {
  readonly name: "pg" | "sqlite"
  /** Appended to a read that a write of the same transaction depends on: a row lock on Postgres; SQLite's write lock already covers it. */
  readonly forUpdate: Statement.Fragment
  /** Appended to a read of rows to claim: concurrent claimers skip each other's rows on Postgres. */
  readonly skipLocked: Statement.Fragment
  /** A JSON document as a statement parameter. */
  readonly json: (v: unknown) => Statement.Fragment
  /**
   * Run first in every write transaction. SQLite opens transactions with a deferred BEGIN; a
   * no-op write takes the database's write lock at once, as BEGIN IMMEDIATE would, so a
   * transaction never reads and then fails to upgrade (SQLITE_BUSY). Nothing on Postgres.
   */
  readonly writeLock: Effect.Effect<unknown, SqlError.SqlError>
  /** Serialises the transactions that count fleet-wide (a per-source cap); SQLite's write lock does. */
  readonly capLock: Effect.Effect<unknown, SqlError.SqlError>
  /** Serialises configuration applies, which number their versions from the newest; SQLite's write lock does. */
  readonly configLock: Effect.Effect<unknown, SqlError.SqlError>
  /**
   * Taken by a revocation, after its device row: claims do not lock the device row, so a
   * revocation waits for the claims in flight (they hold a writer's lock on assignments)
   * and holds new ones back until it commits; they then read the device as revoked. SQLite's
   * write lock already serialises them.
   */
  readonly revocationLock: Effect.Effect<unknown, SqlError.SqlError>
  /**
   * Taken before a transaction's first row lock on a reservation it will then update (a
   * cancellation, a release, a result judged in a transaction): a writer's table lock first,
   * as a single statement that updates the table takes it, so such a transaction and a
   * revocation (`revocationLock`, then the device's row locks) wait for each other in one order
   * instead of deadlocking. Nothing on SQLite.
   */
  readonly reservationWriter: Effect.Effect<unknown, SqlError.SqlError>
  /** The collation that groups raw rows by bytes, as the rollups' columns do. */
  readonly bytes: string
  /**
   * `IN` over a list of integer ids of any length as one parameter (`= ANY` of an array on
   * Postgres, `json_each` on SQLite): a placeholder per id stops at the protocol's 65,535 on
   * Postgres and at 32,766 variables on SQLite. An empty list matches nothing.
   */
  readonly inIds: (ids: ReadonlyArray<number>) => Statement.Fragment
}

// The advisory lock key that serialises claims under a per-source cap ("sfcap" in ASCII).
const CAP_LOCK = 0x7366636170
// The advisory lock key that serialises configuration applies ("sfcfg" in ASCII).
const CONFIG_LOCK = 0x7366636667

/** The dialect of a client. */
export const of = (sql: SqlClient.SqlClient): Dialect =>
  sql.onDialectOrElse({
    pg: (): Dialect => ({
      name: "pg",
      forUpdate: sql.literal(" FOR UPDATE"),
      skipLocked: sql.literal(" FOR UPDATE SKIP LOCKED"),
      json: (v) => sql`${JSON.stringify(v)}::jsonb`,
      writeLock: Effect.void,
      capLock: sql`SELECT pg_advisory_xact_lock(${CAP_LOCK})`,
      configLock: sql`SELECT pg_advisory_xact_lock(${CONFIG_LOCK})`,
      // Conflicts with writers (ROW EXCLUSIVE) and with itself; readers go on.
      revocationLock: sql`LOCK TABLE assignments IN SHARE ROW EXCLUSIVE MODE`,
      reservationWriter: sql`LOCK TABLE assignments IN ROW EXCLUSIVE MODE`,
      bytes: ' COLLATE "C"',
      inIds: (ids) => sql` = ANY (${`{${ids.map((id) => Math.trunc(id)).join(",")}}`}::bigint[])`
    }),
    orElse: (): Dialect => ({
      name: "sqlite",
      forUpdate: sql.literal(""),
      skipLocked: sql.literal(""),
      json: (v) => sql`${JSON.stringify(v)}`,
      writeLock: sql`UPDATE targets SET fence = fence WHERE 0`,
      capLock: Effect.void,
      configLock: Effect.void,
      revocationLock: Effect.void,
      reservationWriter: Effect.void,
      bytes: "",
      inIds: (ids) => sql` IN (SELECT value FROM json_each(${JSON.stringify(ids.map((id) => Math.trunc(id)))}))`
    })
  })
