import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Claim priority: an operator's integer in [-100, 100] on each target (0 for every existing one),
 * and the claim order's index. Claims take pending targets by `id - priority * 10000`, then id
 * (core's `Priority.claimKey`, step 10,000); the partial index is on exactly that expression so a
 * claim still reads the head of one index. It replaces `targets_pending_idx` (id order), which no
 * claim reads any more and every claim would otherwise keep up to date.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE targets ADD COLUMN priority INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100)`
  yield* sql`CREATE INDEX targets_claim_idx ON targets ((id - priority * 10000), id) WHERE status = 'pending'`
  yield* sql`DROP INDEX targets_pending_idx`
})
