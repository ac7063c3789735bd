import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

// 32 neighbouring log buckets share one row (chunk = bucket >> 5, column c<bucket & 31>),
// so a query adds up a few hundred rows per day instead of one per bucket.
const slots = Array.from({ length: 32 }, (_, i) => i)
const columns = slots.map((i) => `c${i} INTEGER NOT NULL DEFAULT 0`).join(", ")
const names = slots.map((i) => `c${i}`).join(", ")
// core's Percentile.bucketOf: ln(gamma) with gamma = 1.009 / 0.991; 0 and anything under
// 1e-6 ms in bucket -100000; above 1e300 ms in 1e300's bucket.
const bucket = (ms: string) => `CASE WHEN NOT (${ms} >= 1e-6) THEN -100000 WHEN ${ms} > 1e300 THEN 38376
  ELSE CAST(ceil(ln(${ms}) / 0.018000486023620893) AS INTEGER) END`
// The spans rolled up: a day, six hours, an hour and ten minutes.
const spans = `(SELECT 86400000 AS span UNION ALL SELECT 21600000 UNION ALL SELECT 3600000 UNION ALL SELECT 600000) AS s`

/**
 * Duration rollups: counts per source, metric, outcome, time span (day, six
 * hours, hour, ten minutes) and log bucket of the duration, so a percentile query merges
 * counts instead of sorting raw rows. A row trigger keeps them in step with
 * every insert into durations, and the existing rows are rolled up here once.
 * Changing the buckets needs a new migration that rebuilds the table.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql.unsafe(`
    CREATE TABLE duration_rollups (
      span BIGINT NOT NULL,
      source TEXT NOT NULL,
      metric TEXT NOT NULL,
      outcome TEXT NOT NULL,
      start BIGINT NOT NULL,
      chunk INTEGER NOT NULL,
      ${columns},
      PRIMARY KEY (span, source, metric, outcome, start, chunk)
    ) WITHOUT ROWID`)
  yield* sql.unsafe(`
    CREATE TRIGGER durations_rollup AFTER INSERT ON durations
    BEGIN
      INSERT INTO duration_rollups (span, source, metric, outcome, start, chunk, ${names})
      SELECT s.span, NEW.source, NEW.metric, NEW.outcome, NEW.at - ((NEW.at % s.span) + s.span) % s.span, b.bucket >> 5,
        ${slots.map((i) => `b.bucket & 31 = ${i}`).join(", ")}
      FROM (SELECT ${bucket("NEW.ms")} AS bucket) AS b CROSS JOIN ${spans} WHERE true
      ON CONFLICT (span, source, metric, outcome, start, chunk) DO UPDATE SET ${slots.map((i) => `c${i} = c${i} + excluded.c${i}`).join(", ")};
    END`)
  yield* sql.unsafe(`
    INSERT INTO duration_rollups (span, source, metric, outcome, start, chunk, ${names})
    SELECT s.span, d.source, d.metric, d.outcome, d.at - ((d.at % s.span) + s.span) % s.span, d.bucket >> 5,
      ${slots.map((i) => `sum(d.bucket & 31 = ${i})`).join(", ")}
    FROM (SELECT source, metric, outcome, at, ${bucket("ms")} AS bucket FROM durations) AS d CROSS JOIN ${spans}
    GROUP BY 1, 2, 3, 4, 5, 6`)
})
