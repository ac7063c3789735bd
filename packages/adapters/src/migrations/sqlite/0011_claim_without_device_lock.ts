import { Effect } from "effect"

/**
 * Nothing to change on SQLite: PostgreSQL's 0011 drops the reference check that made a
 * claim lock its device row. SQLite has no row locks (one writer at a time holds the
 * database), so its reference check costs one index probe and stays. The id is kept so
 * both dialects share one migration list.
 */
export default Effect.void
