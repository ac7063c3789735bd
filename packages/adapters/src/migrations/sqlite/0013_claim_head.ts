import { Effect } from "effect"

/**
 * Nothing to do on SQLite. PostgreSQL's 0013 adds where a claim's index scan starts, because a
 * claimed target's entry stays at the head of its partial claim index until a vacuum; SQLite
 * removes an index entry when its row leaves the index, so its claim index has no such head.
 */
export default Effect.void
