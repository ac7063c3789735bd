import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * An active reservation lies within its device's slots. With one active reservation per
 * slot (0001's unique index), a device can then never hold more reservations than it has
 * slots: capacity is kept by the schema, so a claim needs neither a count nor a write to
 * the device row, and claims of one device's slots do not queue behind each other.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  // The device's slot count travels with the reservation and is checked against the device
  // by a composite foreign key (`slots` never changes once a device is registered); it
  // replaces the plain key on device_id, so an insert still runs one reference check.
  yield* sql`ALTER TABLE devices ADD CONSTRAINT devices_id_slots_key UNIQUE (id, slots)`
  yield* sql`ALTER TABLE assignments ADD COLUMN device_slots INTEGER`
  yield* sql`UPDATE assignments a SET device_slots = d.slots FROM devices d WHERE d.id = a.device_id`
  yield* sql`ALTER TABLE assignments ALTER COLUMN device_slots SET NOT NULL`
  yield* sql`
    ALTER TABLE assignments ADD CONSTRAINT assignments_active_slot_range
    CHECK (state <> 'active' OR (slot >= 0 AND slot < device_slots))`
  yield* sql`
    ALTER TABLE assignments ADD CONSTRAINT assignments_device_slots_fkey
    FOREIGN KEY (device_id, device_slots) REFERENCES devices (id, slots)`
  yield* sql`ALTER TABLE assignments DROP CONSTRAINT assignments_device_id_fkey`
})
