-- Generated from the migrated schema; packages/adapters/test/schema.test.ts checks it.

CREATE TABLE assignments (
      reservation_id INTEGER PRIMARY KEY,
      target_id BIGINT NOT NULL REFERENCES targets (id),
      source TEXT NOT NULL,
      identity TEXT NOT NULL,
      device_id BIGINT NOT NULL REFERENCES devices (id),
      slot INTEGER NOT NULL,
      fence INTEGER NOT NULL,
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
    , device_slots INTEGER, result_body TEXT, policy_id INTEGER REFERENCES policies (id));

CREATE TABLE audit_log (
      id INTEGER PRIMARY KEY,
      at BIGINT NOT NULL,
      who TEXT NOT NULL,
      action TEXT NOT NULL,
      subject TEXT NOT NULL,
      why TEXT NOT NULL,
      detail TEXT NOT NULL
    );

CREATE TABLE cancellations (
      reservation_id BIGINT PRIMARY KEY REFERENCES assignments (reservation_id),
      at BIGINT NOT NULL,
      who TEXT NOT NULL,
      why TEXT NOT NULL
    );

CREATE TABLE config_versions (
      version INTEGER PRIMARY KEY,
      document TEXT NOT NULL,
      applied_by TEXT NOT NULL,
      applied_at BIGINT NOT NULL
    );

CREATE TABLE cycles (
      id INTEGER PRIMARY KEY,
      source TEXT NOT NULL,
      started_at BIGINT NOT NULL,
      ended_at BIGINT NOT NULL,
      pages INTEGER NOT NULL,
      results INTEGER NOT NULL,
      malformed INTEGER NOT NULL,
      queued_new_count INTEGER NOT NULL,
      queued_updated_count INTEGER NOT NULL,
      deferred_count INTEGER NOT NULL,
      stop_reason TEXT NOT NULL,
      error TEXT
    );

CREATE TABLE device_sources (
      device_id BIGINT PRIMARY KEY REFERENCES devices (id),
      sources TEXT NOT NULL
    );

CREATE TABLE devices (
      id INTEGER PRIMARY KEY,
      name TEXT NOT NULL,
      slots INTEGER NOT NULL CHECK (slots >= 0),
      token_hash TEXT NOT NULL,
      created_at BIGINT NOT NULL,
      revoked_at BIGINT
    , containment TEXT, reported_at INTEGER);

CREATE TABLE duration_pending (reservation_id INTEGER PRIMARY KEY);

CREATE TABLE duration_rollups (
      span BIGINT NOT NULL,
      source TEXT NOT NULL,
      metric TEXT NOT NULL,
      outcome TEXT NOT NULL,
      start BIGINT NOT NULL,
      chunk INTEGER NOT NULL,
      c0 INTEGER NOT NULL DEFAULT 0, c1 INTEGER NOT NULL DEFAULT 0, c2 INTEGER NOT NULL DEFAULT 0, c3 INTEGER NOT NULL DEFAULT 0, c4 INTEGER NOT NULL DEFAULT 0, c5 INTEGER NOT NULL DEFAULT 0, c6 INTEGER NOT NULL DEFAULT 0, c7 INTEGER NOT NULL DEFAULT 0, c8 INTEGER NOT NULL DEFAULT 0, c9 INTEGER NOT NULL DEFAULT 0, c10 INTEGER NOT NULL DEFAULT 0, c11 INTEGER NOT NULL DEFAULT 0, c12 INTEGER NOT NULL DEFAULT 0, c13 INTEGER NOT NULL DEFAULT 0, c14 INTEGER NOT NULL DEFAULT 0, c15 INTEGER NOT NULL DEFAULT 0, c16 INTEGER NOT NULL DEFAULT 0, c17 INTEGER NOT NULL DEFAULT 0, c18 INTEGER NOT NULL DEFAULT 0, c19 INTEGER NOT NULL DEFAULT 0, c20 INTEGER NOT NULL DEFAULT 0, c21 INTEGER NOT NULL DEFAULT 0, c22 INTEGER NOT NULL DEFAULT 0, c23 INTEGER NOT NULL DEFAULT 0, c24 INTEGER NOT NULL DEFAULT 0, c25 INTEGER NOT NULL DEFAULT 0, c26 INTEGER NOT NULL DEFAULT 0, c27 INTEGER NOT NULL DEFAULT 0, c28 INTEGER NOT NULL DEFAULT 0, c29 INTEGER NOT NULL DEFAULT 0, c30 INTEGER NOT NULL DEFAULT 0, c31 INTEGER NOT NULL DEFAULT 0,
      PRIMARY KEY (span, start, source, metric, outcome, chunk)
    ) WITHOUT ROWID;

CREATE TABLE durations (
      id INTEGER PRIMARY KEY,
      source TEXT NOT NULL,
      metric TEXT NOT NULL,
      outcome TEXT NOT NULL,
      ms REAL NOT NULL,
      at BIGINT NOT NULL
    );

CREATE TABLE finding_cursors (subscriber TEXT PRIMARY KEY, seq BIGINT NOT NULL);

CREATE TABLE finding_dead_letters (
      subscriber TEXT NOT NULL,
      seq BIGINT NOT NULL,
      attempts INTEGER NOT NULL,
      last_error TEXT NOT NULL,
      at BIGINT NOT NULL,
      PRIMARY KEY (subscriber, seq)
    );

CREATE TABLE finding_events (
      finding_id BIGINT NOT NULL REFERENCES findings (id),
      reservation_id BIGINT NOT NULL,
      kind TEXT NOT NULL,
      revision TEXT,
      at BIGINT NOT NULL,
      PRIMARY KEY (finding_id, reservation_id)
    );

CREATE TABLE finding_outbox (
      seq INTEGER PRIMARY KEY AUTOINCREMENT,
      target_id BIGINT NOT NULL,
      at BIGINT NOT NULL,
      payload TEXT NOT NULL
    );

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
    );

CREATE TABLE findings (
      id INTEGER PRIMARY KEY,
      target_id BIGINT NOT NULL REFERENCES targets (id),
      source TEXT NOT NULL,
      identity TEXT NOT NULL,
      detector TEXT NOT NULL,
      path TEXT NOT NULL,
      line INTEGER,
      fingerprint TEXT NOT NULL,
      preview TEXT NOT NULL,
      verified INTEGER,
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
    );

CREATE TABLE fleet (
      one INTEGER PRIMARY KEY DEFAULT 1 CHECK (one = 1),
      id TEXT NOT NULL,
      created_at INTEGER NOT NULL
    );

CREATE TABLE leases (
      name TEXT PRIMARY KEY,
      holder TEXT NOT NULL,
      token BIGINT NOT NULL,
      expires_at BIGINT NOT NULL
    );

CREATE TABLE policies (
      id INTEGER PRIMARY KEY,
      source TEXT NOT NULL,
      policy TEXT NOT NULL,
      scan_ms REAL NOT NULL,
      upload_ms REAL NOT NULL,
      expiry_ms REAL NOT NULL,
      CONSTRAINT policies_content_key UNIQUE (source, policy, scan_ms, upload_ms, expiry_ms)
    );

CREATE TABLE progress_events (
      reservation_id BIGINT NOT NULL REFERENCES assignments (reservation_id),
      seq INTEGER NOT NULL,
      kind TEXT NOT NULL,
      phase TEXT NOT NULL,
      at BIGINT NOT NULL,
      detail TEXT,
      accepted_at BIGINT NOT NULL,
      PRIMARY KEY (reservation_id, seq)
    );

CREATE TABLE "scanfleet_migrations" (
  migration_id integer PRIMARY KEY NOT NULL,
  created_at datetime NOT NULL DEFAULT current_timestamp,
  name VARCHAR(255) NOT NULL
);

CREATE TABLE source_pauses (
      source TEXT PRIMARY KEY CHECK (source IN ('github', 'gitlab', 'huggingface', 'dockerhub')),
      paused_at BIGINT NOT NULL,
      paused_by TEXT NOT NULL,
      reason TEXT NOT NULL
    );

CREATE TABLE sqlite_sequence(name,seq);

CREATE TABLE target_retries (
      target_id BIGINT PRIMARY KEY REFERENCES targets (id),
      redrives INTEGER NOT NULL DEFAULT 0,
      revision BIGINT,
      retry_at BIGINT,
      planned_fence INTEGER
    );

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
      discovered_at BIGINT NOT NULL, priority INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100),
      CONSTRAINT targets_source_identity_key UNIQUE (source, identity)
    );

CREATE INDEX assignments_active_expiry_idx ON assignments (expires_at, reservation_id) WHERE state = 'active';

CREATE UNIQUE INDEX assignments_active_slot_idx ON assignments (device_id, slot) WHERE state = 'active';

CREATE INDEX assignments_active_source_idx ON assignments (source) WHERE state = 'active';

CREATE TRIGGER assignments_device_active BEFORE INSERT ON assignments
    WHEN NEW.state = 'active' AND NOT EXISTS (
      SELECT 1 FROM devices d
      WHERE d.id = NEW.device_id AND d.revoked_at IS NULL AND d.slots = NEW.device_slots AND NEW.slot >= 0 AND NEW.slot < d.slots
    )
    BEGIN
      SELECT RAISE(ABORT, 'an active reservation needs a live device and a slot within its slots');
    END;

CREATE INDEX assignments_device_idx ON assignments (device_id, reservation_id);

CREATE TRIGGER assignments_policy_kept BEFORE UPDATE OF policy_id ON assignments
      WHEN NEW.policy_id IS NULL
      BEGIN
        SELECT RAISE(ABORT, 'a reservation needs its policy');
      END;

CREATE TRIGGER assignments_policy_required BEFORE INSERT ON assignments
      WHEN NEW.policy_id IS NULL
      BEGIN
        SELECT RAISE(ABORT, 'a reservation needs its policy');
      END;

CREATE INDEX assignments_target_idx ON assignments (target_id, reservation_id);

CREATE INDEX cycles_source_idx ON cycles (source, id);

CREATE INDEX devices_token_hash_idx ON devices (token_hash) WHERE revoked_at IS NULL;

CREATE TRIGGER durations_rollup AFTER INSERT ON durations
    BEGIN
      INSERT INTO duration_rollups (span, source, metric, outcome, start, chunk, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21, c22, c23, c24, c25, c26, c27, c28, c29, c30, c31)
      SELECT s.span, NEW.source, NEW.metric, NEW.outcome, NEW.at - ((NEW.at % s.span) + s.span) % s.span, b.bucket >> 5,
        b.bucket & 31 = 0, b.bucket & 31 = 1, b.bucket & 31 = 2, b.bucket & 31 = 3, b.bucket & 31 = 4, b.bucket & 31 = 5, b.bucket & 31 = 6, b.bucket & 31 = 7, b.bucket & 31 = 8, b.bucket & 31 = 9, b.bucket & 31 = 10, b.bucket & 31 = 11, b.bucket & 31 = 12, b.bucket & 31 = 13, b.bucket & 31 = 14, b.bucket & 31 = 15, b.bucket & 31 = 16, b.bucket & 31 = 17, b.bucket & 31 = 18, b.bucket & 31 = 19, b.bucket & 31 = 20, b.bucket & 31 = 21, b.bucket & 31 = 22, b.bucket & 31 = 23, b.bucket & 31 = 24, b.bucket & 31 = 25, b.bucket & 31 = 26, b.bucket & 31 = 27, b.bucket & 31 = 28, b.bucket & 31 = 29, b.bucket & 31 = 30, b.bucket & 31 = 31
      FROM (SELECT CASE WHEN NOT (NEW.ms >= 1e-6) THEN -100000 WHEN NEW.ms > 1e300 THEN 38376
  ELSE CAST(ceil(ln(NEW.ms) / 0.018000486023620893) AS INTEGER) END AS bucket) AS b CROSS JOIN (SELECT 86400000 AS span UNION ALL SELECT 21600000 UNION ALL SELECT 3600000 UNION ALL SELECT 600000) AS s WHERE true
      ON CONFLICT (span, source, metric, outcome, start, chunk) DO UPDATE SET c0 = c0 + excluded.c0, c1 = c1 + excluded.c1, c2 = c2 + excluded.c2, c3 = c3 + excluded.c3, c4 = c4 + excluded.c4, c5 = c5 + excluded.c5, c6 = c6 + excluded.c6, c7 = c7 + excluded.c7, c8 = c8 + excluded.c8, c9 = c9 + excluded.c9, c10 = c10 + excluded.c10, c11 = c11 + excluded.c11, c12 = c12 + excluded.c12, c13 = c13 + excluded.c13, c14 = c14 + excluded.c14, c15 = c15 + excluded.c15, c16 = c16 + excluded.c16, c17 = c17 + excluded.c17, c18 = c18 + excluded.c18, c19 = c19 + excluded.c19, c20 = c20 + excluded.c20, c21 = c21 + excluded.c21, c22 = c22 + excluded.c22, c23 = c23 + excluded.c23, c24 = c24 + excluded.c24, c25 = c25 + excluded.c25, c26 = c26 + excluded.c26, c27 = c27 + excluded.c27, c28 = c28 + excluded.c28, c29 = c29 + excluded.c29, c30 = c30 + excluded.c30, c31 = c31 + excluded.c31;
    END;

CREATE INDEX durations_source_idx ON durations (source, at);

CREATE INDEX durations_window_idx ON durations (at);

CREATE INDEX finding_scans_target_idx ON finding_scans (target_id, reservation_id);

CREATE INDEX findings_identity_idx ON findings (source, identity, id);

CREATE INDEX findings_source_idx ON findings (source, status, id);

CREATE INDEX findings_status_idx ON findings (status, id);

CREATE INDEX targets_claim_idx ON targets ((id - priority * 10000), id) WHERE status = 'pending';

CREATE INDEX targets_failed_idx ON targets (source, id) WHERE status IN ('failed', 'unresolved');

CREATE INDEX targets_promotion_idx ON targets (source, (COALESCE(last_scan_started_at, completed_at, 0)), id)
    WHERE status = 'completed' AND observed_remote_at > COALESCE(covered_remote_at, completed_at);
