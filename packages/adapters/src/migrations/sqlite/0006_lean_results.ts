import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * The result body moves onto its reservation, as on Postgres: the receipt is derived
 * from the ended reservation by core's WorkerWrite.priorReceipt, so a result no longer
 * inserts a row of its own. (SQLite keeps computing durations when a result is accepted.)
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE assignments ADD COLUMN result_body TEXT`
  yield* sql`UPDATE assignments SET result_body = (SELECT r.body FROM results r WHERE r.reservation_id = assignments.reservation_id)`
  yield* sql`DROP TABLE results`
})
