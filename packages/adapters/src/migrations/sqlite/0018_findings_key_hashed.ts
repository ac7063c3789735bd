import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Findings indexed by status, so the dashboard counts each status (up to a cap) without reading
 * the table. SQLite's unique key on a finding's (target, detector, path, fingerprint) has no size
 * bound per entry, so it stays; PostgreSQL's 0018 keys the same by the hashes of detector and path.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE INDEX findings_status_idx ON findings (status, id)`
})
