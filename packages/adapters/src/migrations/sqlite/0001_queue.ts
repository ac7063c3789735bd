import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/** Targets, devices, reservations, their progress and results. */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE targets (
      id INTEGER PRIMARY KEY,
      source TEXT NOT NULL CHECK (source IN ('github', 'gitlab', 'huggingface', 'dockerhub')),
      identity TEXT NOT NULL,
      status TEXT NOT NULL CHECK (status IN ('pending', 'in_progress', 'completed', 'failed', 'deferred', 'unresolved')),
      observed_remote_at BIGINT,
      covered_remote_at BIGINT,
      completed_at BIGINT,
      last_scan_started_at BIGINT,
      fence INTEGER NOT NULL DEFAULT 0,
      attempts INTEGER NOT NULL DEFAULT 0,
      discovered_at BIGINT NOT NULL,
      CONSTRAINT targets_source_identity_key UNIQUE (source, identity)
    )`
  // claim: the lowest-id pending target
  yield* sql`CREATE INDEX targets_pending_idx ON targets (id) WHERE status = 'pending'`
  // promotion: only completed targets changed since their coverage, per source in core's order (stalest scan first)
  yield* sql`
    CREATE INDEX targets_promotion_idx ON targets (source, (COALESCE(last_scan_started_at, completed_at, 0)), id)
    WHERE status = 'completed' AND observed_remote_at > COALESCE(covered_remote_at, completed_at)`
  yield* sql`
    CREATE TABLE devices (
      id INTEGER PRIMARY KEY,
      name TEXT NOT NULL,
      slots INTEGER NOT NULL CHECK (slots >= 0),
      token_hash TEXT NOT NULL,
      created_at BIGINT NOT NULL,
      revoked_at BIGINT
    )`
  yield* sql`CREATE INDEX devices_token_hash_idx ON devices (token_hash) WHERE revoked_at IS NULL`
  yield* sql`
    CREATE TABLE assignments (
      reservation_id INTEGER PRIMARY KEY,
      target_id BIGINT NOT NULL REFERENCES targets (id),
      source TEXT NOT NULL,
      identity TEXT NOT NULL,
      device_id BIGINT NOT NULL REFERENCES devices (id),
      slot INTEGER NOT NULL,
      fence INTEGER NOT NULL,
      policy TEXT NOT NULL,
      covered_remote_at BIGINT,
      issued_at BIGINT NOT NULL,
      scan_deadline BIGINT NOT NULL,
      upload_deadline BIGINT NOT NULL,
      expires_at BIGINT NOT NULL,
      state TEXT NOT NULL CHECK (state IN ('active', 'completed', 'failed', 'expired', 'released')),
      last_phase TEXT,
      last_seq INTEGER NOT NULL DEFAULT 0,
      last_progress_at BIGINT,
      outcome TEXT,
      final_phase TEXT,
      ended_at BIGINT,
      expired_at BIGINT,
      expiry_last_phase TEXT,
      expiry_last_progress_at BIGINT
    )`
  // one live reservation per device slot, even if two claims race past the checks
  yield* sql`CREATE UNIQUE INDEX assignments_active_slot_idx ON assignments (device_id, slot) WHERE state = 'active'`
  // expiry sweep: active reservations by assignment expiry
  yield* sql`CREATE INDEX assignments_active_expiry_idx ON assignments (expires_at, reservation_id) WHERE state = 'active'`
  // per-source in-flight cap
  yield* sql`CREATE INDEX assignments_active_source_idx ON assignments (source) WHERE state = 'active'`
  yield* sql`CREATE INDEX assignments_device_idx ON assignments (device_id, reservation_id)`
  yield* sql`
    CREATE TABLE progress_events (
      reservation_id BIGINT NOT NULL REFERENCES assignments (reservation_id),
      seq INTEGER NOT NULL,
      kind TEXT NOT NULL,
      phase TEXT NOT NULL,
      at BIGINT NOT NULL,
      detail TEXT,
      accepted_at BIGINT NOT NULL,
      PRIMARY KEY (reservation_id, seq)
    )`
  yield* sql`
    CREATE TABLE results (
      reservation_id BIGINT PRIMARY KEY REFERENCES assignments (reservation_id),
      receipt_id TEXT NOT NULL UNIQUE,
      outcome TEXT NOT NULL,
      accepted_at BIGINT NOT NULL,
      body TEXT NOT NULL
    )`
})
