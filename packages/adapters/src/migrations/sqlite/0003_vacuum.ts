import { Effect } from "effect"

/**
 * PostgreSQL's 0003 tunes autovacuum so that dead index entries left by claims do
 * not pile up at the head of the pending set. SQLite removes a b-tree entry in
 * place when its row changes, so there is nothing to tune; the migration exists so
 * that both dialects keep one list of ids.
 */
export default Effect.void
