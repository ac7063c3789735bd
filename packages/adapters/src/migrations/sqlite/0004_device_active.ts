import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * An active reservation lies within its device's slots and belongs to a live device. With one
 * active reservation per slot (0001's unique index), a device can then never hold more
 * reservations than it has slots. SQLite cannot add a composite foreign key to an existing
 * table, so a trigger checks what Postgres checks with one.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE assignments ADD COLUMN device_slots INTEGER`
  yield* sql`UPDATE assignments SET device_slots = (SELECT d.slots FROM devices d WHERE d.id = assignments.device_id)`
  yield* sql`
    CREATE TRIGGER assignments_device_active BEFORE INSERT ON assignments
    WHEN NEW.state = 'active' AND NOT EXISTS (
      SELECT 1 FROM devices d
      WHERE d.id = NEW.device_id AND d.revoked_at IS NULL AND d.slots = NEW.device_slots AND NEW.slot >= 0 AND NEW.slot < d.slots
    )
    BEGIN
      SELECT RAISE(ABORT, 'an active reservation needs a live device and a slot within its slots');
    END`
})
