import { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import type { Config } from "@scanfleet/core"
import * as Policies from "../../internal/Policies.js"

/**
 * A reservation references its effective policy instead of carrying a copy (see the
 * PostgreSQL 0012): `policies` stores each (source, policy) once with its deadline offsets
 * from issue time (core's `Deadline.issue`), unique on all of it, and a reservation its id.
 *
 * Existing reservations keep their policies: each distinct (source, policy) gets a row (its
 * text as stored) and every reservation its id. SQLite adds a referencing column only as
 * nullable (a rebuild of the table would delete it under its referencing tables inside the
 * migration's transaction), so triggers refuse a reservation without a policy, as NOT NULL would.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE policies (
      id INTEGER PRIMARY KEY,
      source TEXT NOT NULL,
      policy TEXT NOT NULL,
      scan_ms REAL NOT NULL,
      upload_ms REAL NOT NULL,
      expiry_ms REAL NOT NULL,
      CONSTRAINT policies_content_key UNIQUE (source, policy, scan_ms, upload_ms, expiry_ms)
    )`
  const stored = yield* sql<{ source: string; policy: string }>`SELECT DISTINCT source, policy FROM assignments ORDER BY source, policy`
  for (const r of stored) {
    const o = Policies.offsets(JSON.parse(r.policy) as Config.EffectivePolicy)
    yield* sql`INSERT INTO policies (source, policy, scan_ms, upload_ms, expiry_ms) VALUES (${r.source}, ${r.policy}, ${o.scanMs}, ${o.uploadMs}, ${o.expiryMs})`
  }
  yield* sql`ALTER TABLE assignments ADD COLUMN policy_id INTEGER REFERENCES policies (id)`
  yield* sql`UPDATE assignments SET policy_id = (SELECT p.id FROM policies p WHERE p.source = assignments.source AND p.policy = assignments.policy)`
  yield* sql`ALTER TABLE assignments DROP COLUMN policy`
  for (const [name, event] of [["assignments_policy_required", "INSERT"], ["assignments_policy_kept", "UPDATE OF policy_id"]] as const)
    yield* sql.unsafe(`
      CREATE TRIGGER ${name} BEFORE ${event} ON assignments
      WHEN NEW.policy_id IS NULL
      BEGIN
        SELECT RAISE(ABORT, 'a reservation needs its policy');
      END`)
})
