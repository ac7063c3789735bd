import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Duration rollups: counts per source, metric, outcome, hour or day, and log
 * bucket of the duration, so a percentile query merges counts instead of
 * sorting raw rows. A statement-level trigger keeps them in step with every
 * insert into durations (one grouped upsert per statement, whichever path
 * inserted), and the existing rows are rolled up here once.
 *
 * The bucket is core's `Percentile.bucketOf` written out in SQL (ln(gamma) with
 * gamma = 1.009 / 0.991; 0 and anything under 1e-6 ms in bucket -100000; above
 * 1e300 ms in 1e300's bucket). Changing it needs a new migration that rebuilds
 * the table.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE duration_rollups (
      span BIGINT NOT NULL,
      source TEXT NOT NULL,
      metric TEXT NOT NULL,
      outcome TEXT NOT NULL,
      start BIGINT NOT NULL,
      bucket INTEGER NOT NULL,
      n BIGINT NOT NULL,
      PRIMARY KEY (span, source, metric, outcome, start, bucket)
    ) WITH (fillfactor = 80)`
  // Free room in each page keeps the count updates HOT (no index entry per update).
  yield* sql`
    CREATE FUNCTION duration_rollups_add() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      -- Keys in one order for every statement, so concurrent inserts lock rollup rows in
      -- the same order and cannot deadlock on each other.
      INSERT INTO duration_rollups AS r (span, source, metric, outcome, start, bucket, n)
      SELECT s.span, d.source, d.metric, d.outcome, d.at - ((d.at % s.span) + s.span) % s.span, d.bucket, count(*)
      FROM (
        SELECT source, metric, outcome, at,
          CASE WHEN NOT (ms >= 1e-6) THEN -100000 WHEN ms > 1e300 THEN 38376
            ELSE CAST(ceil(ln(ms) / 0.018000486023620893::float8) AS INTEGER) END AS bucket
        FROM new_durations
      ) d CROSS JOIN (VALUES (3600000::bigint), (86400000::bigint)) AS s(span)
      GROUP BY 1, 2, 3, 4, 5, 6
      ORDER BY 1, 2, 3, 4, 5, 6
      ON CONFLICT (span, source, metric, outcome, start, bucket) DO UPDATE SET n = r.n + excluded.n;
      RETURN NULL;
    END
    $$`
  yield* sql`
    CREATE TRIGGER durations_rollup AFTER INSERT ON durations
    REFERENCING NEW TABLE AS new_durations
    FOR EACH STATEMENT EXECUTE FUNCTION duration_rollups_add()`
  yield* sql`
    INSERT INTO duration_rollups (span, source, metric, outcome, start, bucket, n)
    SELECT s.span, d.source, d.metric, d.outcome, d.at - ((d.at % s.span) + s.span) % s.span, d.bucket, count(*)
    FROM (
      SELECT source, metric, outcome, at,
        CASE WHEN NOT (ms >= 1e-6) THEN -100000 WHEN ms > 1e300 THEN 38376
          ELSE CAST(ceil(ln(ms) / 0.018000486023620893::float8) AS INTEGER) END AS bucket
      FROM durations
    ) d CROSS JOIN (VALUES (3600000::bigint), (86400000::bigint)) AS s(span)
    GROUP BY 1, 2, 3, 4, 5, 6`
})
