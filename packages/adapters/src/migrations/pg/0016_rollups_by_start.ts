import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Duration rollups keyed by span and start first. A percentile query reads each stretch of its
 * window as `span = $1 AND start >= $2 AND start < $3`, and adds source, metric and outcome only
 * when it names them. The primary key was (span, source, metric, outcome, start, chunk), so a
 * query over every source, or over every metric of one source, could bound the index by its first
 * one or two columns alone: PostgreSQL skip-scanned it, one descent per group for every stretch
 * (61 for three ten-minute rollups), and a window whose edges fall mid-hour has six-hour, hour and
 * ten-minute stretches at each edge. The key is now (span, start, source, metric, outcome, chunk):
 * every stretch is one range of the index, and a named source, metric or outcome filters within
 * it. The rollups' upserts name the same columns, so they use the new key as they used the old.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE duration_rollups DROP CONSTRAINT duration_rollups_pkey, ADD PRIMARY KEY (span, start, source, metric, outcome, chunk)`
})
