import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Findings as rows, related across the scans of a target: one row per
 * (target, detector, path, fingerprint); the scans that related them with
 * their summaries; the changes in each finding's life; and the outbox that
 * result acceptance writes in the result's transaction. No secret value is in
 * any of them: fingerprints are keyed HMACs, `sealed` is ciphertext under a key
 * the database never holds. Webhook subscribers keep their outbox position and
 * dead letters here.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE findings (
      id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
      target_id BIGINT NOT NULL REFERENCES targets (id),
      source TEXT NOT NULL,
      identity TEXT NOT NULL,
      detector TEXT NOT NULL,
      path TEXT NOT NULL,
      line INTEGER,
      fingerprint TEXT NOT NULL,
      preview TEXT NOT NULL,
      verified BOOLEAN,
      status TEXT NOT NULL,
      first_seen_at BIGINT NOT NULL,
      last_seen_at BIGINT NOT NULL,
      first_revision TEXT,
      last_revision TEXT,
      resolved_at BIGINT,
      resolved_revision TEXT,
      details TEXT NOT NULL,
      sealed TEXT,
      UNIQUE (target_id, detector, path, fingerprint)
    )`
  // list filters: by source and status in id order (the keyset), by identity
  yield* sql`CREATE INDEX findings_source_idx ON findings (source, status, id)`
  yield* sql`CREATE INDEX findings_identity_idx ON findings (source, identity, id)`
  yield* sql`
    CREATE TABLE finding_scans (
      reservation_id BIGINT PRIMARY KEY,
      target_id BIGINT NOT NULL REFERENCES targets (id),
      source TEXT NOT NULL,
      identity TEXT NOT NULL,
      revision TEXT,
      at BIGINT NOT NULL,
      new_count INTEGER NOT NULL,
      present_count INTEGER NOT NULL,
      resolved_count INTEGER NOT NULL
    )`
  yield* sql`CREATE INDEX finding_scans_target_idx ON finding_scans (target_id, reservation_id)`
  yield* sql`
    CREATE TABLE finding_events (
      finding_id BIGINT NOT NULL REFERENCES findings (id),
      reservation_id BIGINT NOT NULL,
      kind TEXT NOT NULL,
      revision TEXT,
      at BIGINT NOT NULL,
      PRIMARY KEY (finding_id, reservation_id)
    )`
  yield* sql`
    CREATE TABLE finding_outbox (
      seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
      target_id BIGINT NOT NULL,
      at BIGINT NOT NULL,
      payload TEXT NOT NULL
    )`
  // webhook delivery: each subscriber's position in the outbox, and what exhausted its tries
  yield* sql`CREATE TABLE finding_cursors (subscriber TEXT PRIMARY KEY, seq BIGINT NOT NULL)`
  yield* sql`
    CREATE TABLE finding_dead_letters (
      subscriber TEXT NOT NULL,
      seq BIGINT NOT NULL,
      attempts INTEGER NOT NULL,
      last_error TEXT NOT NULL,
      at BIGINT NOT NULL,
      PRIMARY KEY (subscriber, seq)
    )`
})
