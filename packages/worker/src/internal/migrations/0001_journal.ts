import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

// The schema a state file reached before this migrator, step by step; PRAGMA user_version said how far.
const before: ReadonlyArray<ReadonlyArray<string>> = [
  [
    `CREATE TABLE slots (slot INTEGER PRIMARY KEY, doc TEXT NOT NULL)`,
    `CREATE TABLE assignments (reservation_id INTEGER PRIMARY KEY, doc TEXT NOT NULL)`,
    `CREATE TABLE events (
       reservation_id INTEGER NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, phase TEXT NOT NULL,
       at INTEGER NOT NULL, detail TEXT, delivery TEXT NOT NULL, acked_at INTEGER, error TEXT,
       PRIMARY KEY (reservation_id, seq))`,
    `CREATE INDEX events_pending ON events (delivery, reservation_id, seq)`,
    `CREATE TABLE results (
       reservation_id INTEGER PRIMARY KEY, after_seq INTEGER NOT NULL, body TEXT NOT NULL,
       delivery TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, error TEXT)`
  ],
  [`ALTER TABLE results ADD COLUMN kind TEXT NOT NULL DEFAULT 'result'`],
  [
    `ALTER TABLE assignments ADD COLUMN status TEXT NOT NULL DEFAULT 'running'`,
    `UPDATE assignments SET status = json_extract(doc, '$.status')`,
    `CREATE INDEX assignments_open ON assignments (status, reservation_id) WHERE status <> 'done'`
  ]
]

/**
 * Slots, assignments, the phase journal and the result outbox, keyed by
 * reservation. A file written before this migrator (its progress in PRAGMA
 * user_version) gets only the steps it had not run, so its rows carry over.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const [{ user_version }] = (yield* sql.unsafe("PRAGMA user_version")) as unknown as Array<{ user_version: number }>
  for (const step of before.slice(user_version)) for (const stmt of step) yield* sql.unsafe(stmt)
  yield* sql.unsafe(`PRAGMA user_version = ${before.length}`)
})
