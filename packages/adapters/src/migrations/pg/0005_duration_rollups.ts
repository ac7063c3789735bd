import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

// 32 neighbouring log buckets share one row (chunk = bucket >> 5, column c<bucket & 31>),
// so a query adds up a few hundred rows per day instead of one per bucket.
const slots = Array.from({ length: 32 }, (_, i) => i)
const columns = slots.map((i) => `c${i} INTEGER NOT NULL DEFAULT 0`).join(", ")
const names = slots.map((i) => `c${i}`).join(", ")
const counts = slots.map((i) => `count(*) FILTER (WHERE d.bucket & 31 = ${i})`).join(", ")
const adds = slots.map((i) => `c${i} = r.c${i} + excluded.c${i}`).join(", ")
// core's Percentile.bucketOf: ln(gamma) with gamma = 1.009 / 0.991; 0 and anything under
// 1e-6 ms in bucket -100000; above 1e300 ms in 1e300's bucket.
const bucket = `CASE WHEN NOT (ms >= 1e-6) THEN -100000 WHEN ms > 1e300 THEN 38376
  ELSE CAST(ceil(ln(ms) / 0.018000486023620893::float8) AS INTEGER) END`
// The spans rolled up: a day, six hours, an hour and ten minutes.
const spans = `(VALUES (86400000::bigint), (21600000::bigint), (3600000::bigint), (600000::bigint)) AS s(span)`
const grouped = (from: string) => `
  SELECT s.span, d.source, d.metric, d.outcome, d.at - ((d.at % s.span) + s.span) % s.span, d.bucket >> 5, ${counts}
  FROM (SELECT source, metric, outcome, at, ${bucket} AS bucket FROM ${from}) AS d CROSS JOIN ${spans}
  GROUP BY 1, 2, 3, 4, 5, 6`

/**
 * Duration rollups: counts per source, metric, outcome, time span (day, six
 * hours, hour, ten minutes) and log bucket of the duration, so a percentile query merges
 * counts instead of sorting raw rows. A statement-level trigger records the
 * grouped counts of every insert into durations, whichever path inserted, and
 * the existing rows are rolled up here once.
 * Changing the buckets needs a new migration that rebuilds the table.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  // "C" collation: grouping and index comparisons by bytes, not by the locale's rules.
  // Free room in each page keeps the count updates HOT (no new index entry per update).
  yield* sql.unsafe(`
    CREATE TABLE duration_rollups (
      span BIGINT NOT NULL,
      source TEXT COLLATE "C" NOT NULL,
      metric TEXT COLLATE "C" NOT NULL,
      outcome TEXT COLLATE "C" NOT NULL,
      start BIGINT NOT NULL,
      chunk INTEGER NOT NULL,
      ${columns},
      PRIMARY KEY (span, source, metric, outcome, start, chunk)
    ) WITH (fillfactor = 80)`)
  // Rows committed by concurrent writers would wait on each other's locks of the same
  // rollup rows until commit, so by default a statement only appends its grouped counts
  // to duration_rollup_deltas (no conflicts, no locks held on shared rows); a reader folds
  // them in (see SqlStore). Bulk writers that own the table's traffic set
  // scanfleet.rollups_direct for their transaction and upsert the rollups at once, keys
  // in one order so that concurrent upserts cannot deadlock.
  // The same columns (types, collations, NOT NULL, defaults), without the key: deltas repeat keys.
  yield* sql.unsafe(`CREATE TABLE duration_rollup_deltas (LIKE duration_rollups INCLUDING DEFAULTS)`)
  yield* sql.unsafe(`
    CREATE FUNCTION duration_rollups_add() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF current_setting('scanfleet.rollups_direct', true) = 'on' THEN
        INSERT INTO duration_rollups AS r (span, source, metric, outcome, start, chunk, ${names})
        ${grouped("new_durations")}
        ORDER BY 1, 2, 3, 4, 5, 6
        ON CONFLICT (span, source, metric, outcome, start, chunk) DO UPDATE SET ${adds};
      ELSE
        INSERT INTO duration_rollup_deltas (span, source, metric, outcome, start, chunk, ${names})
        ${grouped("new_durations")};
      END IF;
      RETURN NULL;
    END
    $$`)
  yield* sql`
    CREATE TRIGGER durations_rollup AFTER INSERT ON durations
    REFERENCING NEW TABLE AS new_durations
    FOR EACH STATEMENT EXECUTE FUNCTION duration_rollups_add()`
  // The raw rows a query still reads (the partial ten minutes at a window's ends) come
  // from one covering index: the window index is no longer needed, and skip scan serves
  // queries that do not name a source, metric or outcome.
  yield* sql`DROP INDEX durations_window_idx`
  yield* sql`DROP INDEX durations_source_idx`
  yield* sql`CREATE INDEX durations_source_idx ON durations (source, metric, outcome, at) INCLUDE (ms)`
  yield* sql.unsafe(`INSERT INTO duration_rollups (span, source, metric, outcome, start, chunk, ${names}) ${grouped("durations")}`)
})
