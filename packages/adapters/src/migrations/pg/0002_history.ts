import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/** Discovery cycles, duration observations and managed configuration versions. */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE cycles (
      id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
    )`
  yield* sql`CREATE INDEX cycles_source_idx ON cycles (source, id)`
  yield* sql`
    CREATE TABLE durations (
      id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
      source TEXT NOT NULL,
      metric TEXT NOT NULL,
      outcome TEXT NOT NULL,
      ms DOUBLE PRECISION NOT NULL,
      at BIGINT NOT NULL
    )`
  // percentile queries: one window, optionally narrowed by source
  yield* sql`CREATE INDEX durations_window_idx ON durations (at)`
  yield* sql`CREATE INDEX durations_source_idx ON durations (source, metric, outcome, at)`
  yield* sql`
    CREATE TABLE config_versions (
      version INTEGER PRIMARY KEY,
      document JSONB NOT NULL,
      applied_by TEXT NOT NULL,
      applied_at BIGINT NOT NULL
    )`
})
