import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * A finding's identity within its target (detector, path, fingerprint) is unique by the hashes of
 * its detector and path. The B-tree entry of the unique key held both in full, and a key entry
 * stops at 2,704 bytes: a result whose finding had a detector and path within their limits in
 * characters (500 and 2,000) but not in bytes (2,000 CJK characters are 6,000 bytes) was refused
 * whole with 54000, and its scan lost. `md5` of each is 32 characters whatever the text, and the
 * index still leads with the target, so a target's findings are read through it as before.
 * SQLite's keys have no such bound. On both, findings are indexed by status, so the dashboard
 * counts each status (up to a cap) without reading the table.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE findings DROP CONSTRAINT findings_target_id_detector_path_fingerprint_key`
  yield* sql`CREATE UNIQUE INDEX findings_target_key ON findings (target_id, fingerprint, md5(detector), md5(path))`
  yield* sql`CREATE INDEX findings_status_idx ON findings (status, id)`
})
