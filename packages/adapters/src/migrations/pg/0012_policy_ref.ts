import { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import type { Config } from "@scanfleet/core"
import * as Codec from "../../internal/Codec.js"
import * as Policies from "../../internal/Policies.js"

/**
 * A reservation references its effective policy instead of carrying a copy. The policy
 * (about 160 bytes of JSON) was written into every reservation row, twice per job (the insert
 * at the claim and the rewrite at the result), and a claim sent every source's policy as
 * parameters. Now `policies` stores each (source, policy) once with its deadline offsets from
 * issue time (core's `Deadline.issue`), unique on all of it, so the same policy is one row
 * whichever store interned it; a claim names the rows by id and reads the offsets there, and
 * a read of a reservation takes its document by `policy_id`.
 *
 * Existing reservations keep their policies: each distinct (source, policy) gets a row and
 * every reservation its id. No foreign-key constraint: its check would key-share lock the
 * policy row on every reservation insert (a tuple write, and a multixact when claims run at
 * once, on the few rows every claim shares: what 0011 removed for the device row). Policy rows
 * are only ever inserted (never updated or deleted), and ids come from the rows themselves.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE policies (
      id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
      source text NOT NULL,
      policy jsonb NOT NULL,
      scan_ms double precision NOT NULL,
      upload_ms double precision NOT NULL,
      expiry_ms double precision NOT NULL,
      CONSTRAINT policies_content_key UNIQUE (source, policy, scan_ms, upload_ms, expiry_ms)
    )`
  const stored = yield* sql<{ source: string; policy: unknown }>`SELECT DISTINCT source, policy FROM assignments ORDER BY source, policy`
  if (stored.length > 0) {
    const rows = stored.map((r) => {
      const policy = Codec.json<Config.EffectivePolicy>(r.policy)
      return { source: r.source, policy: JSON.stringify(policy), ...Policies.offsets(policy) }
    })
    yield* sql`
      INSERT INTO policies (source, policy, scan_ms, upload_ms, expiry_ms)
      SELECT * FROM unnest(${rows.map((r) => r.source)}::text[], ${rows.map((r) => r.policy)}::jsonb[], ${rows.map((r) => r.scanMs)}::float8[],
        ${rows.map((r) => r.uploadMs)}::float8[], ${rows.map((r) => r.expiryMs)}::float8[])`
  }
  yield* sql`ALTER TABLE assignments ADD COLUMN policy_id integer`
  yield* sql`UPDATE assignments a SET policy_id = p.id FROM policies p WHERE p.source = a.source AND p.policy = a.policy`
  yield* sql`ALTER TABLE assignments ALTER COLUMN policy_id SET NOT NULL`
  yield* sql`ALTER TABLE assignments DROP COLUMN policy`
})
