import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Every assignment belongs to the fleet that issued it: assignments, events
 * and results are keyed by (fleet, reservation), because reservation ids
 * restart at 1 in another database. Rows written before fleets had ids join
 * the `legacy` fleet, which the first fleet the device registers with takes
 * over. `n` orders assignments by claim, whatever their fleet. `fleets`
 * remembers the server each fleet was reached through; `meta` what the last
 * controller said about itself (its containment level).
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE assignments_v2 (
      n INTEGER PRIMARY KEY,
      fleet_id TEXT NOT NULL,
      reservation_id INTEGER NOT NULL,
      doc TEXT NOT NULL,
      status TEXT NOT NULL,
      UNIQUE (fleet_id, reservation_id))`
  yield* sql`
    INSERT INTO assignments_v2 (fleet_id, reservation_id, doc, status)
    SELECT 'legacy', reservation_id, json_set(doc, '$.fleetId', 'legacy', '$.view.fleetId', 'legacy'), status FROM assignments ORDER BY reservation_id`
  yield* sql`DROP TABLE assignments`
  yield* sql`ALTER TABLE assignments_v2 RENAME TO assignments`
  yield* sql`CREATE INDEX assignments_open ON assignments (status, n) WHERE status <> 'done'`
  yield* sql`CREATE INDEX assignments_reservation ON assignments (reservation_id, n)`

  yield* sql`
    CREATE TABLE events_v2 (
      fleet_id TEXT NOT NULL, reservation_id INTEGER NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, phase TEXT NOT NULL,
      at INTEGER NOT NULL, detail TEXT, delivery TEXT NOT NULL, acked_at INTEGER, error TEXT,
      PRIMARY KEY (fleet_id, reservation_id, seq))`
  yield* sql`
    INSERT INTO events_v2 SELECT 'legacy', reservation_id, seq, kind, phase, at, detail, delivery, acked_at, error FROM events`
  yield* sql`DROP TABLE events`
  yield* sql`ALTER TABLE events_v2 RENAME TO events`
  yield* sql`CREATE INDEX events_pending ON events (delivery, fleet_id, reservation_id, seq)`

  yield* sql`
    CREATE TABLE results_v2 (
      fleet_id TEXT NOT NULL, reservation_id INTEGER NOT NULL, after_seq INTEGER NOT NULL, body TEXT NOT NULL,
      delivery TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, error TEXT, kind TEXT NOT NULL DEFAULT 'result',
      PRIMARY KEY (fleet_id, reservation_id))`
  yield* sql`
    INSERT INTO results_v2 SELECT 'legacy', reservation_id, after_seq, body, delivery, attempts, error, kind FROM results`
  yield* sql`DROP TABLE results`
  yield* sql`ALTER TABLE results_v2 RENAME TO results`

  yield* sql`UPDATE slots SET doc = json_set(doc, '$.fleetId', CASE WHEN json_extract(doc, '$.reservationId') IS NULL THEN NULL ELSE 'legacy' END)`
  yield* sql`CREATE TABLE fleets (fleet_id TEXT PRIMARY KEY, server TEXT, first_seen INTEGER NOT NULL, last_seen INTEGER NOT NULL)`
  yield* sql`CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)`
})
