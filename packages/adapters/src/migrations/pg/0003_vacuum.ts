import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Autovacuum settings for the queue tables. Every claim moves a target out of
 * `targets_pending_idx` and every ended assignment out of the partial indexes on
 * active assignments; the old entries stay in those indexes, at the head of the
 * next claim's scan, until a vacuum removes them. With the defaults a vacuum
 * waits for a fifth of the table to be dead (400,000 claims on 2M targets), so
 * each claim would step over ever more dead entries. Here a vacuum is due after a
 * fixed number of changed rows whatever the table's size, runs unthrottled, and
 * always cleans the indexes (PostgreSQL would otherwise skip index cleanup when
 * few heap pages are affected, which is exactly the claim pattern).
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  for (const table of ["targets", "assignments"]) {
    yield* sql`
      ALTER TABLE ${sql(table)} SET (
        autovacuum_vacuum_scale_factor = 0,
        autovacuum_vacuum_threshold = 10000,
        autovacuum_vacuum_insert_scale_factor = 0,
        autovacuum_vacuum_insert_threshold = 100000,
        autovacuum_analyze_scale_factor = 0.02,
        autovacuum_vacuum_cost_delay = 0,
        vacuum_index_cleanup = on
      )`
  }
})
