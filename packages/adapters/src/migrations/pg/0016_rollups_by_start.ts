import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Duration rollups keyed by span and start first. A percentile query reads each stretch of its
 * window as `span = $1 AND start >= $2 AND start < $3`, and adds source, metric and outcome only
 * when it names them. The primary key was (span, source, metric, outcome, start, chunk), so a
 * query over every source, or over every metric of one source, bounded the index by its first one
 * or two columns alone and read every rollup of the span, however short the stretch: a window
 * whose edges fall mid-hour has six-hour, hour and ten-minute stretches at each edge, and over
 * seven days the ten-minute rollups alone are a row per ten minutes, group and chunk. The key is
 * now (span, start, source, metric, outcome, chunk): every stretch is a range of the index, and a
 * named source, metric or outcome filters within it. The rollups' upserts name the same columns,
 * so they use the new key as they used the old one.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE duration_rollups DROP CONSTRAINT duration_rollups_pkey, ADD PRIMARY KEY (span, start, source, metric, outcome, chunk)`
})
