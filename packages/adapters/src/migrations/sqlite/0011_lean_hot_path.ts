import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * An accepted result no longer computes its durations in its own transaction: it names
 * its reservation in `duration_pending`, and a fold (the sweep, or a percentile read
 * before it reads) stores the durations core's WorkerWrite.durationsOfEnded gives from
 * the ended row and its timeline, with their rollups, as on PostgreSQL since 0006. The
 * result's transaction then reads no timeline and fires no rollup trigger.
 *
 * (PostgreSQL's 0011 drops the reference check that made a claim lock its device row;
 * SQLite has no row locks, so its reference check stays.)
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE duration_pending (reservation_id INTEGER PRIMARY KEY)`
})
