import { Effect } from "effect"

/**
 * Nothing to do on SQLite. PostgreSQL's 0015 narrows the expiry index's predicate so that a
 * claim's busy-slot check cannot be planned as a scan of that whole index, which there walks an
 * entry for every reservation ended since the last vacuum. SQLite removes a row's entry from a
 * partial index as soon as the row leaves it, so its indexes on active reservations hold only the
 * active ones, whichever the planner reads.
 */
export default Effect.void
