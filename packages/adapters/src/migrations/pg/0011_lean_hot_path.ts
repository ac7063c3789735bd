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
 *
 * The partial index on active reservations by source goes too: the per-source cap counts
 * the active reservations through the expiry index (both hold exactly the active rows),
 * and the index cost every reservation an entry. It also misled a claim's busy-slot check:
 * planned while the reservations were few, the check scanned that whole index for each
 * requested slot instead of probing the unique (device, slot) index, and that index keeps
 * the entries of ended reservations until a vacuum (30 ms for a claim of 64 slots with
 * 200,000 reservations stored).
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE assignments DROP CONSTRAINT assignments_device_slots_fkey`
  yield* sql`DROP INDEX assignments_active_source_idx`
})
