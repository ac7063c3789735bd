import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * The operator port's tables: the failure backoff of each target (beside the target row, so
 * the hot rows stay narrow), cancellations, paused sources, device claim filters, the audit
 * log and the leases that serialise discovery across server instances.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE target_retries (
      target_id BIGINT PRIMARY KEY REFERENCES targets (id),
      redrives INTEGER NOT NULL DEFAULT 0,
      revision BIGINT,
      retry_at BIGINT,
      planned_fence INTEGER
    )`
  // redrive: the failed and unresolved targets of a source, in id order
  yield* sql`CREATE INDEX targets_failed_idx ON targets (source, id) WHERE status IN ('failed', 'unresolved')`
  // inspection and the failure time: a target's assignments, newest first
  yield* sql`CREATE INDEX assignments_target_idx ON assignments (target_id, reservation_id)`
  yield* sql`
    CREATE TABLE cancellations (
      reservation_id BIGINT PRIMARY KEY REFERENCES assignments (reservation_id),
      at BIGINT NOT NULL,
      who TEXT NOT NULL,
      why TEXT NOT NULL
    )`
  yield* sql`
    CREATE TABLE source_pauses (
      source TEXT PRIMARY KEY CHECK (source IN ('github', 'gitlab', 'huggingface', 'dockerhub')),
      paused_at BIGINT NOT NULL,
      paused_by TEXT NOT NULL,
      reason TEXT NOT NULL
    )`
  yield* sql`
    CREATE TABLE device_sources (
      device_id BIGINT PRIMARY KEY REFERENCES devices (id),
      sources TEXT NOT NULL
    )`
  yield* sql`
    CREATE TABLE audit_log (
      id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
      at BIGINT NOT NULL,
      who TEXT NOT NULL,
      action TEXT NOT NULL,
      subject TEXT NOT NULL,
      why TEXT NOT NULL,
      detail TEXT NOT NULL
    )`
  yield* sql`
    CREATE TABLE leases (
      name TEXT PRIMARY KEY,
      holder TEXT NOT NULL,
      token BIGINT NOT NULL,
      expires_at BIGINT NOT NULL
    )`
})
