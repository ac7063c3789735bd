-- Generated from the migrated schema; packages/adapters/test/schema.test.ts checks it.

CREATE TABLE assignments (
  reservation_id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  target_id bigint NOT NULL,
  source text NOT NULL,
  identity text NOT NULL,
  device_id bigint NOT NULL,
  slot integer NOT NULL,
  fence integer NOT NULL,
  covered_remote_at bigint,
  issued_at bigint NOT NULL,
  scan_deadline bigint NOT NULL,
  upload_deadline bigint NOT NULL,
  expires_at bigint NOT NULL,
  state text NOT NULL,
  last_phase text,
  last_seq integer DEFAULT 0 NOT NULL,
  last_progress_at bigint,
  outcome text,
  final_phase text,
  ended_at bigint,
  expired_at bigint,
  expiry_last_phase text,
  expiry_last_progress_at bigint,
  device_slots integer NOT NULL,
  result_body text,
  policy_id integer NOT NULL
);

CREATE TABLE audit_log (
  id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  at bigint NOT NULL,
  who text NOT NULL,
  action text NOT NULL,
  subject text NOT NULL,
  why text NOT NULL,
  detail text NOT NULL
);

CREATE TABLE cancellations (
  reservation_id bigint NOT NULL,
  at bigint NOT NULL,
  who text NOT NULL,
  why text NOT NULL
);

CREATE TABLE claim_head (
  one boolean DEFAULT true NOT NULL,
  key bigint NOT NULL,
  epoch bigint DEFAULT 0 NOT NULL
);

CREATE TABLE config_versions (
  version integer NOT NULL,
  document jsonb NOT NULL,
  applied_by text NOT NULL,
  applied_at bigint NOT NULL
);

CREATE TABLE cycles (
  id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  source text NOT NULL,
  started_at bigint NOT NULL,
  ended_at bigint NOT NULL,
  pages integer NOT NULL,
  results integer NOT NULL,
  malformed integer NOT NULL,
  queued_new_count integer NOT NULL,
  queued_updated_count integer NOT NULL,
  deferred_count integer NOT NULL,
  stop_reason text NOT NULL,
  error text
);

CREATE TABLE device_sources (
  device_id bigint NOT NULL,
  sources text NOT NULL
);

CREATE TABLE devices (
  id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  name text NOT NULL,
  slots integer NOT NULL,
  token_hash text NOT NULL,
  created_at bigint NOT NULL,
  revoked_at bigint,
  containment text,
  reported_at bigint
);

CREATE TABLE duration_pending (
  reservation_id bigint NOT NULL
);

CREATE TABLE duration_rollup_deltas (
  span bigint NOT NULL,
  source text NOT NULL,
  metric text NOT NULL,
  outcome text NOT NULL,
  start bigint NOT NULL,
  chunk integer NOT NULL,
  c0 integer DEFAULT 0 NOT NULL,
  c1 integer DEFAULT 0 NOT NULL,
  c2 integer DEFAULT 0 NOT NULL,
  c3 integer DEFAULT 0 NOT NULL,
  c4 integer DEFAULT 0 NOT NULL,
  c5 integer DEFAULT 0 NOT NULL,
  c6 integer DEFAULT 0 NOT NULL,
  c7 integer DEFAULT 0 NOT NULL,
  c8 integer DEFAULT 0 NOT NULL,
  c9 integer DEFAULT 0 NOT NULL,
  c10 integer DEFAULT 0 NOT NULL,
  c11 integer DEFAULT 0 NOT NULL,
  c12 integer DEFAULT 0 NOT NULL,
  c13 integer DEFAULT 0 NOT NULL,
  c14 integer DEFAULT 0 NOT NULL,
  c15 integer DEFAULT 0 NOT NULL,
  c16 integer DEFAULT 0 NOT NULL,
  c17 integer DEFAULT 0 NOT NULL,
  c18 integer DEFAULT 0 NOT NULL,
  c19 integer DEFAULT 0 NOT NULL,
  c20 integer DEFAULT 0 NOT NULL,
  c21 integer DEFAULT 0 NOT NULL,
  c22 integer DEFAULT 0 NOT NULL,
  c23 integer DEFAULT 0 NOT NULL,
  c24 integer DEFAULT 0 NOT NULL,
  c25 integer DEFAULT 0 NOT NULL,
  c26 integer DEFAULT 0 NOT NULL,
  c27 integer DEFAULT 0 NOT NULL,
  c28 integer DEFAULT 0 NOT NULL,
  c29 integer DEFAULT 0 NOT NULL,
  c30 integer DEFAULT 0 NOT NULL,
  c31 integer DEFAULT 0 NOT NULL
);

CREATE TABLE duration_rollups (
  span bigint NOT NULL,
  source text NOT NULL,
  metric text NOT NULL,
  outcome text NOT NULL,
  start bigint NOT NULL,
  chunk integer NOT NULL,
  c0 integer DEFAULT 0 NOT NULL,
  c1 integer DEFAULT 0 NOT NULL,
  c2 integer DEFAULT 0 NOT NULL,
  c3 integer DEFAULT 0 NOT NULL,
  c4 integer DEFAULT 0 NOT NULL,
  c5 integer DEFAULT 0 NOT NULL,
  c6 integer DEFAULT 0 NOT NULL,
  c7 integer DEFAULT 0 NOT NULL,
  c8 integer DEFAULT 0 NOT NULL,
  c9 integer DEFAULT 0 NOT NULL,
  c10 integer DEFAULT 0 NOT NULL,
  c11 integer DEFAULT 0 NOT NULL,
  c12 integer DEFAULT 0 NOT NULL,
  c13 integer DEFAULT 0 NOT NULL,
  c14 integer DEFAULT 0 NOT NULL,
  c15 integer DEFAULT 0 NOT NULL,
  c16 integer DEFAULT 0 NOT NULL,
  c17 integer DEFAULT 0 NOT NULL,
  c18 integer DEFAULT 0 NOT NULL,
  c19 integer DEFAULT 0 NOT NULL,
  c20 integer DEFAULT 0 NOT NULL,
  c21 integer DEFAULT 0 NOT NULL,
  c22 integer DEFAULT 0 NOT NULL,
  c23 integer DEFAULT 0 NOT NULL,
  c24 integer DEFAULT 0 NOT NULL,
  c25 integer DEFAULT 0 NOT NULL,
  c26 integer DEFAULT 0 NOT NULL,
  c27 integer DEFAULT 0 NOT NULL,
  c28 integer DEFAULT 0 NOT NULL,
  c29 integer DEFAULT 0 NOT NULL,
  c30 integer DEFAULT 0 NOT NULL,
  c31 integer DEFAULT 0 NOT NULL
);

CREATE TABLE durations (
  id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  source text NOT NULL,
  metric text NOT NULL,
  outcome text NOT NULL,
  ms double precision NOT NULL,
  at bigint NOT NULL
);

CREATE TABLE finding_cursors (
  subscriber text NOT NULL,
  seq bigint NOT NULL
);

CREATE TABLE finding_dead_letters (
  subscriber text NOT NULL,
  seq bigint NOT NULL,
  attempts integer NOT NULL,
  last_error text NOT NULL,
  at bigint NOT NULL
);

CREATE TABLE finding_events (
  finding_id bigint NOT NULL,
  reservation_id bigint NOT NULL,
  kind text NOT NULL,
  revision text,
  at bigint NOT NULL
);

CREATE TABLE finding_outbox (
  seq bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  target_id bigint NOT NULL,
  at bigint NOT NULL,
  payload text NOT NULL
);

CREATE TABLE finding_scans (
  reservation_id bigint NOT NULL,
  target_id bigint NOT NULL,
  source text NOT NULL,
  identity text NOT NULL,
  revision text,
  at bigint NOT NULL,
  new_count integer NOT NULL,
  present_count integer NOT NULL,
  resolved_count integer NOT NULL
);

CREATE TABLE findings (
  id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  target_id bigint NOT NULL,
  source text NOT NULL,
  identity text NOT NULL,
  detector text NOT NULL,
  path text NOT NULL,
  line integer,
  fingerprint text NOT NULL,
  preview text NOT NULL,
  verified boolean,
  status text NOT NULL,
  first_seen_at bigint NOT NULL,
  last_seen_at bigint NOT NULL,
  first_revision text,
  last_revision text,
  resolved_at bigint,
  resolved_revision text,
  details text NOT NULL,
  sealed text
);

CREATE TABLE fleet (
  one boolean DEFAULT true NOT NULL,
  id text NOT NULL,
  created_at bigint NOT NULL
);

CREATE TABLE leases (
  name text NOT NULL,
  holder text NOT NULL,
  token bigint NOT NULL,
  expires_at bigint NOT NULL
);

CREATE TABLE policies (
  id integer GENERATED ALWAYS AS IDENTITY NOT NULL,
  source text NOT NULL,
  policy jsonb NOT NULL,
  scan_ms double precision NOT NULL,
  upload_ms double precision NOT NULL,
  expiry_ms double precision NOT NULL
);

CREATE TABLE progress_events (
  reservation_id bigint NOT NULL,
  seq integer NOT NULL,
  kind text NOT NULL,
  phase text NOT NULL,
  at bigint NOT NULL,
  detail text,
  accepted_at bigint NOT NULL
);

CREATE TABLE scanfleet_migrations (
  migration_id integer NOT NULL,
  created_at timestamp with time zone DEFAULT now() NOT NULL,
  name text NOT NULL
);

CREATE TABLE source_pauses (
  source text NOT NULL,
  paused_at bigint NOT NULL,
  paused_by text NOT NULL,
  reason text NOT NULL
);

CREATE TABLE target_retries (
  target_id bigint NOT NULL,
  redrives integer DEFAULT 0 NOT NULL,
  revision bigint,
  retry_at bigint,
  planned_fence integer
);

CREATE TABLE targets (
  id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  source text NOT NULL,
  identity text NOT NULL,
  status text NOT NULL,
  observed_remote_at bigint,
  covered_remote_at bigint,
  completed_at bigint,
  last_scan_started_at bigint,
  fence integer DEFAULT 0 NOT NULL,
  attempts integer DEFAULT 0 NOT NULL,
  discovered_at bigint NOT NULL,
  priority integer DEFAULT 0 NOT NULL
);

ALTER TABLE assignments ADD CONSTRAINT assignments_active_slot_range CHECK (((state <> 'active'::text) OR ((slot >= 0) AND (slot < device_slots))));
ALTER TABLE assignments ADD CONSTRAINT assignments_pkey PRIMARY KEY (reservation_id);
ALTER TABLE assignments ADD CONSTRAINT assignments_state_check CHECK ((state = ANY (ARRAY['active'::text, 'completed'::text, 'failed'::text, 'expired'::text, 'released'::text])));
ALTER TABLE audit_log ADD CONSTRAINT audit_log_pkey PRIMARY KEY (id);
ALTER TABLE cancellations ADD CONSTRAINT cancellations_pkey PRIMARY KEY (reservation_id);
ALTER TABLE cancellations ADD CONSTRAINT cancellations_reservation_id_fkey FOREIGN KEY (reservation_id) REFERENCES assignments(reservation_id);
ALTER TABLE claim_head ADD CONSTRAINT claim_head_one_check CHECK (one);
ALTER TABLE claim_head ADD CONSTRAINT claim_head_pkey PRIMARY KEY (one);
ALTER TABLE config_versions ADD CONSTRAINT config_versions_pkey PRIMARY KEY (version);
ALTER TABLE cycles ADD CONSTRAINT cycles_pkey PRIMARY KEY (id);
ALTER TABLE device_sources ADD CONSTRAINT device_sources_device_id_fkey FOREIGN KEY (device_id) REFERENCES devices(id);
ALTER TABLE device_sources ADD CONSTRAINT device_sources_pkey PRIMARY KEY (device_id);
ALTER TABLE devices ADD CONSTRAINT devices_id_slots_key UNIQUE (id, slots);
ALTER TABLE devices ADD CONSTRAINT devices_pkey PRIMARY KEY (id);
ALTER TABLE devices ADD CONSTRAINT devices_slots_check CHECK ((slots >= 0));
ALTER TABLE duration_rollups ADD CONSTRAINT duration_rollups_pkey PRIMARY KEY (span, start, source, metric, outcome, chunk);
ALTER TABLE durations ADD CONSTRAINT durations_pkey PRIMARY KEY (id);
ALTER TABLE finding_cursors ADD CONSTRAINT finding_cursors_pkey PRIMARY KEY (subscriber);
ALTER TABLE finding_dead_letters ADD CONSTRAINT finding_dead_letters_pkey PRIMARY KEY (subscriber, seq);
ALTER TABLE finding_events ADD CONSTRAINT finding_events_finding_id_fkey FOREIGN KEY (finding_id) REFERENCES findings(id);
ALTER TABLE finding_events ADD CONSTRAINT finding_events_pkey PRIMARY KEY (finding_id, reservation_id);
ALTER TABLE finding_outbox ADD CONSTRAINT finding_outbox_pkey PRIMARY KEY (seq);
ALTER TABLE finding_scans ADD CONSTRAINT finding_scans_pkey PRIMARY KEY (reservation_id);
ALTER TABLE finding_scans ADD CONSTRAINT finding_scans_target_id_fkey FOREIGN KEY (target_id) REFERENCES targets(id);
ALTER TABLE findings ADD CONSTRAINT findings_pkey PRIMARY KEY (id);
ALTER TABLE findings ADD CONSTRAINT findings_target_id_fkey FOREIGN KEY (target_id) REFERENCES targets(id);
ALTER TABLE fleet ADD CONSTRAINT fleet_one_check CHECK (one);
ALTER TABLE fleet ADD CONSTRAINT fleet_pkey PRIMARY KEY (one);
ALTER TABLE leases ADD CONSTRAINT leases_pkey PRIMARY KEY (name);
ALTER TABLE policies ADD CONSTRAINT policies_content_key UNIQUE (source, policy, scan_ms, upload_ms, expiry_ms);
ALTER TABLE policies ADD CONSTRAINT policies_pkey PRIMARY KEY (id);
ALTER TABLE progress_events ADD CONSTRAINT progress_events_pkey PRIMARY KEY (reservation_id, seq);
ALTER TABLE scanfleet_migrations ADD CONSTRAINT scanfleet_migrations_pkey PRIMARY KEY (migration_id);
ALTER TABLE source_pauses ADD CONSTRAINT source_pauses_pkey PRIMARY KEY (source);
ALTER TABLE source_pauses ADD CONSTRAINT source_pauses_source_check CHECK ((source = ANY (ARRAY['github'::text, 'gitlab'::text, 'huggingface'::text, 'dockerhub'::text])));
ALTER TABLE target_retries ADD CONSTRAINT target_retries_pkey PRIMARY KEY (target_id);
ALTER TABLE target_retries ADD CONSTRAINT target_retries_target_id_fkey FOREIGN KEY (target_id) REFERENCES targets(id);
ALTER TABLE targets ADD CONSTRAINT targets_pkey PRIMARY KEY (id);
ALTER TABLE targets ADD CONSTRAINT targets_priority_check CHECK (((priority >= '-100'::integer) AND (priority <= 100)));
ALTER TABLE targets ADD CONSTRAINT targets_source_check CHECK ((source = ANY (ARRAY['github'::text, 'gitlab'::text, 'huggingface'::text, 'dockerhub'::text])));
ALTER TABLE targets ADD CONSTRAINT targets_source_identity_key UNIQUE (source, identity);
ALTER TABLE targets ADD CONSTRAINT targets_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'in_progress'::text, 'completed'::text, 'failed'::text, 'deferred'::text, 'unresolved'::text])));

CREATE INDEX assignments_active_expiry_idx ON assignments USING btree (expires_at, reservation_id) WHERE ((state = 'active'::text) AND (expires_at IS NOT NULL));
CREATE UNIQUE INDEX assignments_active_slot_idx ON assignments USING btree (device_id, slot) WHERE (state = 'active'::text);
CREATE INDEX assignments_device_idx ON assignments USING btree (device_id, reservation_id);
CREATE UNIQUE INDEX assignments_pkey ON assignments USING btree (reservation_id);
CREATE INDEX assignments_target_idx ON assignments USING btree (target_id, reservation_id);
CREATE UNIQUE INDEX audit_log_pkey ON audit_log USING btree (id);
CREATE UNIQUE INDEX cancellations_pkey ON cancellations USING btree (reservation_id);
CREATE UNIQUE INDEX claim_head_pkey ON claim_head USING btree (one);
CREATE UNIQUE INDEX config_versions_pkey ON config_versions USING btree (version);
CREATE UNIQUE INDEX cycles_pkey ON cycles USING btree (id);
CREATE INDEX cycles_source_idx ON cycles USING btree (source, id);
CREATE UNIQUE INDEX device_sources_pkey ON device_sources USING btree (device_id);
CREATE UNIQUE INDEX devices_id_slots_key ON devices USING btree (id, slots);
CREATE UNIQUE INDEX devices_pkey ON devices USING btree (id);
CREATE INDEX devices_token_hash_idx ON devices USING btree (token_hash) WHERE (revoked_at IS NULL);
CREATE UNIQUE INDEX duration_rollups_pkey ON duration_rollups USING btree (span, start, source, metric, outcome, chunk);
CREATE UNIQUE INDEX durations_pkey ON durations USING btree (id);
CREATE INDEX durations_source_idx ON durations USING btree (source, metric, outcome, at) INCLUDE (ms);
CREATE UNIQUE INDEX finding_cursors_pkey ON finding_cursors USING btree (subscriber);
CREATE UNIQUE INDEX finding_dead_letters_pkey ON finding_dead_letters USING btree (subscriber, seq);
CREATE UNIQUE INDEX finding_events_pkey ON finding_events USING btree (finding_id, reservation_id);
CREATE UNIQUE INDEX finding_outbox_pkey ON finding_outbox USING btree (seq);
CREATE UNIQUE INDEX finding_scans_pkey ON finding_scans USING btree (reservation_id);
CREATE INDEX finding_scans_target_idx ON finding_scans USING btree (target_id, reservation_id);
CREATE INDEX findings_identity_idx ON findings USING btree (source, identity, id);
CREATE UNIQUE INDEX findings_pkey ON findings USING btree (id);
CREATE INDEX findings_source_idx ON findings USING btree (source, status, id);
CREATE INDEX findings_status_idx ON findings USING btree (status, id);
CREATE UNIQUE INDEX findings_target_key ON findings USING btree (target_id, fingerprint, md5(detector), md5(path));
CREATE UNIQUE INDEX fleet_pkey ON fleet USING btree (one);
CREATE UNIQUE INDEX leases_pkey ON leases USING btree (name);
CREATE UNIQUE INDEX policies_content_key ON policies USING btree (source, policy, scan_ms, upload_ms, expiry_ms);
CREATE UNIQUE INDEX policies_pkey ON policies USING btree (id);
CREATE UNIQUE INDEX progress_events_pkey ON progress_events USING btree (reservation_id, seq);
CREATE UNIQUE INDEX scanfleet_migrations_pkey ON scanfleet_migrations USING btree (migration_id);
CREATE UNIQUE INDEX source_pauses_pkey ON source_pauses USING btree (source);
CREATE UNIQUE INDEX target_retries_pkey ON target_retries USING btree (target_id);
CREATE INDEX targets_claim_idx ON targets USING btree (((id - (priority * 10000))), id) WHERE (status = 'pending'::text);
CREATE INDEX targets_failed_idx ON targets USING btree (source, id) WHERE (status = ANY (ARRAY['failed'::text, 'unresolved'::text]));
CREATE UNIQUE INDEX targets_pkey ON targets USING btree (id);
CREATE INDEX targets_promotion_idx ON targets USING btree (source, COALESCE(last_scan_started_at, completed_at, (0)::bigint), id) WHERE ((status = 'completed'::text) AND (observed_remote_at > COALESCE(covered_remote_at, completed_at)));
CREATE UNIQUE INDEX targets_source_identity_key ON targets USING btree (source, identity);

ALTER TABLE assignments SET (autovacuum_vacuum_scale_factor=0, autovacuum_vacuum_threshold=10000, autovacuum_vacuum_insert_scale_factor=0, autovacuum_vacuum_insert_threshold=100000, autovacuum_analyze_scale_factor=0.02, autovacuum_vacuum_cost_delay=0, vacuum_index_cleanup=on);
ALTER TABLE duration_rollups SET (fillfactor=80);
ALTER TABLE targets SET (autovacuum_vacuum_scale_factor=0, autovacuum_vacuum_threshold=10000, autovacuum_vacuum_insert_scale_factor=0, autovacuum_vacuum_insert_threshold=100000, autovacuum_analyze_scale_factor=0.02, autovacuum_vacuum_cost_delay=0, vacuum_index_cleanup=on);

CREATE OR REPLACE FUNCTION duration_rollups_add()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
    BEGIN
      IF current_setting('scanfleet.rollups_direct', true) = 'on' THEN
        INSERT INTO duration_rollups AS r (span, source, metric, outcome, start, chunk, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21, c22, c23, c24, c25, c26, c27, c28, c29, c30, c31)
        
  SELECT s.span, d.source, d.metric, d.outcome, d.at - ((d.at % s.span) + s.span) % s.span, d.bucket >> 5, count(*) FILTER (WHERE d.bucket & 31 = 0), count(*) FILTER (WHERE d.bucket & 31 = 1), count(*) FILTER (WHERE d.bucket & 31 = 2), count(*) FILTER (WHERE d.bucket & 31 = 3), count(*) FILTER (WHERE d.bucket & 31 = 4), count(*) FILTER (WHERE d.bucket & 31 = 5), count(*) FILTER (WHERE d.bucket & 31 = 6), count(*) FILTER (WHERE d.bucket & 31 = 7), count(*) FILTER (WHERE d.bucket & 31 = 8), count(*) FILTER (WHERE d.bucket & 31 = 9), count(*) FILTER (WHERE d.bucket & 31 = 10), count(*) FILTER (WHERE d.bucket & 31 = 11), count(*) FILTER (WHERE d.bucket & 31 = 12), count(*) FILTER (WHERE d.bucket & 31 = 13), count(*) FILTER (WHERE d.bucket & 31 = 14), count(*) FILTER (WHERE d.bucket & 31 = 15), count(*) FILTER (WHERE d.bucket & 31 = 16), count(*) FILTER (WHERE d.bucket & 31 = 17), count(*) FILTER (WHERE d.bucket & 31 = 18), count(*) FILTER (WHERE d.bucket & 31 = 19), count(*) FILTER (WHERE d.bucket & 31 = 20), count(*) FILTER (WHERE d.bucket & 31 = 21), count(*) FILTER (WHERE d.bucket & 31 = 22), count(*) FILTER (WHERE d.bucket & 31 = 23), count(*) FILTER (WHERE d.bucket & 31 = 24), count(*) FILTER (WHERE d.bucket & 31 = 25), count(*) FILTER (WHERE d.bucket & 31 = 26), count(*) FILTER (WHERE d.bucket & 31 = 27), count(*) FILTER (WHERE d.bucket & 31 = 28), count(*) FILTER (WHERE d.bucket & 31 = 29), count(*) FILTER (WHERE d.bucket & 31 = 30), count(*) FILTER (WHERE d.bucket & 31 = 31)
  FROM (SELECT source, metric, outcome, at, CASE WHEN NOT (ms >= 1e-6) THEN -100000 WHEN ms > 1e300 THEN 38376
  ELSE CAST(ceil(ln(ms) / 0.018000486023620893::float8) AS INTEGER) END AS bucket FROM new_durations) AS d CROSS JOIN (VALUES (86400000::bigint), (21600000::bigint), (3600000::bigint), (600000::bigint)) AS s(span)
  GROUP BY 1, 2, 3, 4, 5, 6
        ORDER BY 1, 2, 3, 4, 5, 6
        ON CONFLICT (span, source, metric, outcome, start, chunk) DO UPDATE SET c0 = r.c0 + excluded.c0, c1 = r.c1 + excluded.c1, c2 = r.c2 + excluded.c2, c3 = r.c3 + excluded.c3, c4 = r.c4 + excluded.c4, c5 = r.c5 + excluded.c5, c6 = r.c6 + excluded.c6, c7 = r.c7 + excluded.c7, c8 = r.c8 + excluded.c8, c9 = r.c9 + excluded.c9, c10 = r.c10 + excluded.c10, c11 = r.c11 + excluded.c11, c12 = r.c12 + excluded.c12, c13 = r.c13 + excluded.c13, c14 = r.c14 + excluded.c14, c15 = r.c15 + excluded.c15, c16 = r.c16 + excluded.c16, c17 = r.c17 + excluded.c17, c18 = r.c18 + excluded.c18, c19 = r.c19 + excluded.c19, c20 = r.c20 + excluded.c20, c21 = r.c21 + excluded.c21, c22 = r.c22 + excluded.c22, c23 = r.c23 + excluded.c23, c24 = r.c24 + excluded.c24, c25 = r.c25 + excluded.c25, c26 = r.c26 + excluded.c26, c27 = r.c27 + excluded.c27, c28 = r.c28 + excluded.c28, c29 = r.c29 + excluded.c29, c30 = r.c30 + excluded.c30, c31 = r.c31 + excluded.c31;
      ELSE
        INSERT INTO duration_rollup_deltas (span, source, metric, outcome, start, chunk, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21, c22, c23, c24, c25, c26, c27, c28, c29, c30, c31)
        
  SELECT s.span, d.source, d.metric, d.outcome, d.at - ((d.at % s.span) + s.span) % s.span, d.bucket >> 5, count(*) FILTER (WHERE d.bucket & 31 = 0), count(*) FILTER (WHERE d.bucket & 31 = 1), count(*) FILTER (WHERE d.bucket & 31 = 2), count(*) FILTER (WHERE d.bucket & 31 = 3), count(*) FILTER (WHERE d.bucket & 31 = 4), count(*) FILTER (WHERE d.bucket & 31 = 5), count(*) FILTER (WHERE d.bucket & 31 = 6), count(*) FILTER (WHERE d.bucket & 31 = 7), count(*) FILTER (WHERE d.bucket & 31 = 8), count(*) FILTER (WHERE d.bucket & 31 = 9), count(*) FILTER (WHERE d.bucket & 31 = 10), count(*) FILTER (WHERE d.bucket & 31 = 11), count(*) FILTER (WHERE d.bucket & 31 = 12), count(*) FILTER (WHERE d.bucket & 31 = 13), count(*) FILTER (WHERE d.bucket & 31 = 14), count(*) FILTER (WHERE d.bucket & 31 = 15), count(*) FILTER (WHERE d.bucket & 31 = 16), count(*) FILTER (WHERE d.bucket & 31 = 17), count(*) FILTER (WHERE d.bucket & 31 = 18), count(*) FILTER (WHERE d.bucket & 31 = 19), count(*) FILTER (WHERE d.bucket & 31 = 20), count(*) FILTER (WHERE d.bucket & 31 = 21), count(*) FILTER (WHERE d.bucket & 31 = 22), count(*) FILTER (WHERE d.bucket & 31 = 23), count(*) FILTER (WHERE d.bucket & 31 = 24), count(*) FILTER (WHERE d.bucket & 31 = 25), count(*) FILTER (WHERE d.bucket & 31 = 26), count(*) FILTER (WHERE d.bucket & 31 = 27), count(*) FILTER (WHERE d.bucket & 31 = 28), count(*) FILTER (WHERE d.bucket & 31 = 29), count(*) FILTER (WHERE d.bucket & 31 = 30), count(*) FILTER (WHERE d.bucket & 31 = 31)
  FROM (SELECT source, metric, outcome, at, CASE WHEN NOT (ms >= 1e-6) THEN -100000 WHEN ms > 1e300 THEN 38376
  ELSE CAST(ceil(ln(ms) / 0.018000486023620893::float8) AS INTEGER) END AS bucket FROM new_durations) AS d CROSS JOIN (VALUES (86400000::bigint), (21600000::bigint), (3600000::bigint), (600000::bigint)) AS s(span)
  GROUP BY 1, 2, 3, 4, 5, 6;
      END IF;
      RETURN NULL;
    END
    $function$;

CREATE OR REPLACE FUNCTION scanfleet_claim_head_inserted()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
    BEGIN
      UPDATE claim_head h SET key = LEAST(h.key, m.key), epoch = h.epoch + 1
      FROM (SELECT min(n.id - n.priority * 10000) AS key FROM written n WHERE n.status = 'pending') m
      WHERE m.key IS NOT NULL;
      RETURN NULL;
    END
    $function$;

CREATE OR REPLACE FUNCTION scanfleet_claim_head_updated()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
    BEGIN
      UPDATE claim_head SET key = LEAST(key, NEW.id - NEW.priority * 10000), epoch = epoch + 1
      WHERE key > NEW.id - NEW.priority * 10000 OR xmin <> pg_current_xact_id()::xid;
      RETURN NULL;
    END
    $function$;

CREATE OR REPLACE FUNCTION scanfleet_claimable(sources text[], n bigint)
 RETURNS TABLE(id bigint, key bigint)
 LANGUAGE sql
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET enable_sort TO 'off'
AS $function$
      SELECT c.id, c.id - c.priority * 10000 FROM targets c
      WHERE c.status = 'pending' AND c.source = ANY (sources) AND c.id - c.priority * 10000 >= (SELECT h.key FROM claim_head h)
      ORDER BY c.id - c.priority * 10000, c.id
      LIMIT n
      FOR UPDATE OF c SKIP LOCKED
    $function$;

CREATE OR REPLACE FUNCTION scanfleet_raise_claim_head()
 RETURNS void
 LANGUAGE sql
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET enable_sort TO 'off'
AS $function$
      UPDATE claim_head h SET key = m.key
      FROM (SELECT h0.epoch, (
        SELECT c.id - c.priority * 10000 FROM targets c
        WHERE c.status = 'pending' AND c.id - c.priority * 10000 >= h0.key
        ORDER BY c.id - c.priority * 10000, c.id LIMIT 1) AS key FROM claim_head h0) m
      WHERE h.epoch = m.epoch AND m.key > h.key
    $function$;

CREATE TRIGGER durations_rollup AFTER INSERT ON durations REFERENCING NEW TABLE AS new_durations FOR EACH STATEMENT EXECUTE FUNCTION duration_rollups_add();
CREATE TRIGGER targets_claim_head_insert AFTER INSERT ON targets REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION scanfleet_claim_head_inserted();
CREATE TRIGGER targets_claim_head_update AFTER UPDATE OF status, priority ON targets FOR EACH ROW WHEN ((new.status = 'pending'::text)) EXECUTE FUNCTION scanfleet_claim_head_updated();
