import { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import { randomUUID } from "node:crypto"

/**
 * The fleet: every database is one fleet, named by an id chosen once, here,
 * and never changed. Assignments carry it so a device keys its local journal
 * by (fleet, reservation): reservation ids restart at 1 in another database,
 * fleet ids do not repeat. The one-row table cannot hold a second id. Devices
 * also keep the process containment they last reported.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE fleet (
      one INTEGER PRIMARY KEY DEFAULT 1 CHECK (one = 1),
      id TEXT NOT NULL,
      created_at INTEGER NOT NULL
    )`
  yield* sql`INSERT INTO fleet (id, created_at) VALUES (${randomUUID()}, ${Date.now()})`
  yield* sql`ALTER TABLE devices ADD COLUMN containment TEXT`
  yield* sql`ALTER TABLE devices ADD COLUMN reported_at INTEGER`
})
