import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Duration rollups: counts per source, metric, outcome, hour or day, and log
 * bucket of the duration, so a percentile query merges counts instead of
 * sorting raw rows. A row trigger keeps them in step with every insert into
 * durations, and the existing rows are rolled up here once.
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
    ) WITHOUT ROWID`
  yield* sql`
    CREATE TRIGGER durations_rollup AFTER INSERT ON durations
    BEGIN
      INSERT INTO duration_rollups (span, source, metric, outcome, start, bucket, n)
      SELECT s.span, NEW.source, NEW.metric, NEW.outcome, NEW.at - ((NEW.at % s.span) + s.span) % s.span,
        CASE WHEN NOT (NEW.ms >= 1e-6) THEN -100000 WHEN NEW.ms > 1e300 THEN 38376
          ELSE CAST(ceil(ln(NEW.ms) / 0.018000486023620893) AS INTEGER) END, 1
      FROM (SELECT 3600000 AS span UNION ALL SELECT 86400000) AS s WHERE true
      ON CONFLICT (span, source, metric, outcome, start, bucket) DO UPDATE SET n = n + 1;
    END`
  yield* sql`
    INSERT INTO duration_rollups (span, source, metric, outcome, start, bucket, n)
    SELECT s.span, d.source, d.metric, d.outcome, d.at - ((d.at % s.span) + s.span) % s.span, d.bucket, count(*)
    FROM (
      SELECT source, metric, outcome, at,
        CASE WHEN NOT (ms >= 1e-6) THEN -100000 WHEN ms > 1e300 THEN 38376
          ELSE CAST(ceil(ln(ms) / 0.018000486023620893) AS INTEGER) END AS bucket
      FROM durations
    ) AS d CROSS JOIN (SELECT 3600000 AS span UNION ALL SELECT 86400000) AS s
    GROUP BY 1, 2, 3, 4, 5, 6`
})
