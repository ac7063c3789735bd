import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Where a claim's scan of `targets_claim_idx` starts. A claimed target leaves its entry at the
 * head of the partial index until a vacuum removes it, and every claim walked all of them: over a
 * million claims the claim statement's buffers grew from about 50 to 100 and more between two
 * autovacuums. `claim_head` holds one key no pending target's claim key is below; a claim scans
 * from it, and the sweep moves it up to the lowest pending key it sees
 * (`scanfleet_raise_claim_head`).
 *
 * The rule that keeps it exact lives here, in triggers, so no statement that makes a target
 * pending can forget it: when a write leaves a target pending, the head goes down to that
 * target's key (when lower) and its `epoch` goes up. The
 * sweep raises the head only where the epoch it read is still the row's, under the row's lock, so
 * it never raises the head over a pending target it could not see: one written by a transaction
 * still open when the sweep read has either bumped the epoch already (the sweep's update waits
 * for it and then finds the epoch changed) or bumps it later, when it lowers the head below
 * itself. A target locked by an open claim is still pending in the sweep's snapshot, so the head
 * never passes a claim that may yet roll back.
 *
 * An insert of targets fires a statement-level trigger (a transition table): discovery's batches
 * of new targets write the head once each. An update fires a row-level trigger only for a row
 * whose status or priority it wrote and which it leaves pending, so a claim or a result (rows
 * leaving pending) costs no trigger call. The key is core's Priority.claimKey, as in 0010's index.
 *
 * The claim's pick moves into `scanfleet_claimable`, run with bitmap scans, sequential scans and
 * sorts disabled, so its plan is the claim index's ordered scan from the head whatever the
 * statistics say. With a range on the index and a planner that believes few targets are pending
 * (a queue loaded since the last analyse, or analysed while nearly all were completed), a bitmap
 * scan of everything from the head and a sort cost less on paper, and would lock rows in sort order
 * after reading the whole queue. It locks and returns at most `n` targets (SKIP LOCKED).
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE claim_head (
      one boolean PRIMARY KEY DEFAULT true CHECK (one),
      key bigint NOT NULL,
      epoch bigint NOT NULL DEFAULT 0
    )`
  yield* sql`INSERT INTO claim_head (key) SELECT COALESCE(min(id - priority * 10000), 0) FROM targets WHERE status = 'pending'`
  // Inserts (discovery's batches of new targets): once per statement, over its transition table.
  yield* sql`
    CREATE FUNCTION scanfleet_claim_head_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      UPDATE claim_head h SET key = LEAST(h.key, m.key), epoch = h.epoch + 1
      FROM (SELECT min(n.id - n.priority * 10000) AS key FROM written n WHERE n.status = 'pending') m
      WHERE m.key IS NOT NULL;
      RETURN NULL;
    END
    $$`
  // Updates: only rows left pending by a write of their status or priority (promotion, expiry,
  // release, requeue, a new priority), so a claim or a result (rows leaving pending) fires nothing.
  // A transaction that has bumped the epoch holds the head's row to its end (a sweep waits for it
  // and then finds the epoch moved), so its later rows write only to lower the head.
  yield* sql`
    CREATE FUNCTION scanfleet_claim_head_updated() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      UPDATE claim_head SET key = LEAST(key, NEW.id - NEW.priority * 10000), epoch = epoch + 1
      WHERE key > NEW.id - NEW.priority * 10000 OR xmin <> pg_current_xact_id()::xid;
      RETURN NULL;
    END
    $$`
  yield* sql`
    CREATE FUNCTION scanfleet_claimable(sources text[], n bigint) RETURNS TABLE (id bigint, key bigint)
    LANGUAGE sql VOLATILE
    SET enable_bitmapscan = off SET enable_seqscan = off SET enable_sort = off
    AS $$
      SELECT c.id, c.id - c.priority * 10000 FROM targets c
      WHERE c.status = 'pending' AND c.source = ANY (sources) AND c.id - c.priority * 10000 >= (SELECT h.key FROM claim_head h)
      ORDER BY c.id - c.priority * 10000, c.id
      LIMIT n
      FOR UPDATE OF c SKIP LOCKED
    $$`
  // The sweep's raise, planned as the claim's pick is: to the lowest pending key at or above the
  // head, only where the epoch it read is still the row's (a waiting update re-reads the row).
  yield* sql`
    CREATE FUNCTION scanfleet_raise_claim_head() RETURNS void
    LANGUAGE sql VOLATILE
    SET enable_bitmapscan = off SET enable_seqscan = off SET enable_sort = off
    AS $$
      UPDATE claim_head h SET key = m.key
      FROM (SELECT h0.epoch, (
        SELECT c.id - c.priority * 10000 FROM targets c
        WHERE c.status = 'pending' AND c.id - c.priority * 10000 >= h0.key
        ORDER BY c.id - c.priority * 10000, c.id LIMIT 1) AS key FROM claim_head h0) m
      WHERE h.epoch = m.epoch AND m.key > h.key
    $$`
  yield* sql`CREATE TRIGGER targets_claim_head_insert AFTER INSERT ON targets REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION scanfleet_claim_head_inserted()`
  yield* sql`
    CREATE TRIGGER targets_claim_head_update AFTER UPDATE OF status, priority ON targets
    FOR EACH ROW WHEN (NEW.status = 'pending') EXECUTE FUNCTION scanfleet_claim_head_updated()`
})
