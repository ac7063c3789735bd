import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * A percentile window read by its start, as on PostgreSQL since its 0016, so that what a query
 * reads grows with its window, not with the store's history.
 *
 * The rollups are keyed by span and start first. A query reads each stretch of its window as
 * `span = ? AND start >= ? AND start < ?`, and adds source, metric and outcome only when it names
 * them. On the old key, (span, source, metric, outcome, start, chunk), SQLite bounded such a search
 * by `span` alone (by `span` and `source` when one is named): every stretch read every rollup of
 * its span ever written. The table is WITHOUT ROWID, clustered on its key, so the key changes only
 * by a rebuild: the table is renamed, its rows copied into one of the new key, and the trigger that
 * fills it from `durations` is dropped first (a rename checks every trigger's tables) and made again
 * from its own text afterwards. Its upsert names the key's columns in the old order, which SQLite
 * matches to a unique key as a set.
 *
 * The raw durations at the window's two edges named by a source were searched by
 * `durations_source_idx (source, metric, outcome, at)` on `source` alone, every duration of the
 * source ever recorded, since the query rarely names the two columns between. The index is now
 * `(source, at)`: a source and a range of time. Without a source the edges read
 * `durations_window_idx (at)` as before.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const trigger = yield* sql<{ sql: string }>`SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'durations_rollup'`
  const table = yield* sql<{ sql: string }>`SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'duration_rollups'`
  const oldKey = "PRIMARY KEY (span, source, metric, outcome, start, chunk)"
  if (trigger.length !== 1 || table.length !== 1 || !table[0].sql.includes(oldKey))
    return yield* Effect.dieMessage("0017_windows_by_start: duration_rollups or its trigger is not as migration 0005 made them")
  yield* sql.unsafe(`DROP TRIGGER durations_rollup`)
  yield* sql.unsafe(`ALTER TABLE duration_rollups RENAME TO duration_rollups_by_group`)
  yield* sql.unsafe(table[0].sql.replace(oldKey, "PRIMARY KEY (span, start, source, metric, outcome, chunk)"))
  yield* sql.unsafe(`INSERT INTO duration_rollups SELECT * FROM duration_rollups_by_group`)
  yield* sql.unsafe(`DROP TABLE duration_rollups_by_group`)
  yield* sql.unsafe(trigger[0].sql)
  yield* sql.unsafe(`DROP INDEX durations_source_idx`)
  yield* sql.unsafe(`CREATE INDEX durations_source_idx ON durations (source, at)`)
})
