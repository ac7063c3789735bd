import { Effect } from "effect"

/**
 * Nothing to do on SQLite yet. PostgreSQL's 0016 keys the duration rollups by span and start
 * first, so that a percentile query over every source reads each stretch of its window as a
 * range of the key. SQLite's rollups are a WITHOUT ROWID table clustered on the old key, which
 * only a rebuild of the table (and of the trigger that fills it) could change: 0017 does that.
 */
export default Effect.void
