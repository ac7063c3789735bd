import { Effect } from "effect"

/**
 * Nothing to do on PostgreSQL: its 0016 changed the rollups' key in place, and its durations index
 * `(source, metric, outcome, at) INCLUDE (ms)` is skip-scanned to a range of `at` when a query
 * names only the source. SQLite's 0017 rebuilds its rollups to the same key and indexes its
 * durations by source and time.
 */
export default Effect.void
