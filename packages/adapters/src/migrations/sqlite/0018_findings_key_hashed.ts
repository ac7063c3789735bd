import { Effect } from "effect"

/**
 * Nothing to do on SQLite: its unique key on a finding's (target, detector, path, fingerprint) has
 * no size bound per entry. PostgreSQL's 0018 keys the same by the hashes of detector and path.
 */
export default Effect.void
