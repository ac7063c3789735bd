import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * The hot path's rows no longer check references that cannot break. A reservation's insert ran
 * the foreign-key check on `assignments.target_id` (a trigger call, an index probe and a key-share
 * lock on the target row the same statement had just updated: a tuple write and its WAL record per
 * claim), and every progress event's insert ran the one on `progress_events.reservation_id`
 * against its reservation. Nothing ever deletes a target or a reservation, and both ids are taken
 * from the rows themselves in the statements that write them (a claim inserts the reservation of
 * the target it updated; progress is appended to a reservation it found and locked), so the checks
 * guarded nothing; what they cost is measured in docs/performance.md. Findings, scans and retries
 * keep their references: they are written off the hot path, and rarely.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE assignments DROP CONSTRAINT IF EXISTS assignments_target_id_fkey`
  yield* sql`ALTER TABLE progress_events DROP CONSTRAINT IF EXISTS progress_events_reservation_id_fkey`
})
