import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * A claim no longer touches the device row. The composite reference of 0004 made every
 * reservation insert lock its device row (a key-share lock is a tuple write: WAL, a dirtied
 * page, a multixact when slots of one device claim at once) and run a reference check.
 * What it guarded is kept otherwise: a device's `slots` never changes once registered and a
 * device is never deleted, so the slot count a claim copies from the device row is exact;
 * the range check of 0004 and the one-active-reservation-per-slot index still hold the
 * capacity in the schema; and a revocation serialises against claims in flight under its
 * own lock (it locks the assignments table against writers while it revokes, so a claim
 * either committed before it, and is ended by it, or starts after it and sees the device
 * revoked).
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE assignments DROP CONSTRAINT assignments_device_slots_fkey`
})
