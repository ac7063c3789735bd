import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Fewer rows per accepted result. The result body moves onto its reservation (the
 * receipt is derived from the ended reservation by core's WorkerWrite.priorReceipt), so
 * a result no longer inserts a row and two index entries of its own. The durations of
 * an accepted result are no longer computed in its statement: the reservation joins a
 * narrow pending list, which the expiry sweep and every percentile read fold into
 * durations (and the rollups) in batches, by core's rule. The list has no index: it is
 * only ever taken whole, a batch at a time, by row address.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE assignments ADD COLUMN result_body TEXT`
  yield* sql`UPDATE assignments a SET result_body = r.body FROM results r WHERE r.reservation_id = a.reservation_id`
  yield* sql`DROP TABLE results`
  yield* sql`CREATE TABLE duration_pending (reservation_id BIGINT NOT NULL)`
})
