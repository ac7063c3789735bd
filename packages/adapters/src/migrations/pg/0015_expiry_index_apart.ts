import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * The expiry index no longer serves a claim's busy-slot check. Both partial indexes on active
 * reservations had the predicate `state = 'active'`, so the check (is this device's slot held by an
 * active reservation?) could be planned on either, and after an analyse that found few active
 * reservations the planner scanned the whole expiry index for each requested slot, filtering on
 * device and slot, instead of probing the unique `(device_id, slot)` index. That index keeps an
 * entry for every reservation ended since the last vacuum, so a claim of 64 read about 80,000
 * buffers (1,300 a claim, for 40 to 50 seconds of the bench's soak, until a vacuum or the next
 * analyse). The predicate now also says `expires_at IS NOT NULL`: always true (the column is NOT
 * NULL) and implied by the sweep's `expires_at <= now`, so the sweep still reads this index, but
 * no busy-slot check can be planned on it; the check probes the slot index by both columns.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`DROP INDEX assignments_active_expiry_idx`
  yield* sql`CREATE INDEX assignments_active_expiry_idx ON assignments (expires_at, reservation_id) WHERE state = 'active' AND expires_at IS NOT NULL`
})
