import type { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import { type Store, Target } from "@scanfleet/core"

interface Row {
  readonly source: string
  readonly identity: string
  remoteAt: number | null
  readonly ord: number
}

/**
 * Folds a batch into one row per target, in order of first appearance: an
 * upsert may touch a row only once per statement, and repeated records of one
 * identity merge exactly as core's `Target.observe` merges them. Identities
 * are looked up per source, so no key is built per observation.
 */
export const fold = (batch: ReadonlyArray<Target.Observation>): ReadonlyArray<Row> => {
  const bySource = new Map<string, Map<string, Row>>()
  const rows: Array<Row> = []
  for (const o of batch) {
    let known = bySource.get(o.source)
    if (known === undefined) bySource.set(o.source, (known = new Map()))
    const prior = known.get(o.identity)
    if (prior !== undefined) prior.remoteAt = Target.mergeObserved(prior.remoteAt, o.remoteAt)
    else {
      const row: Row = { source: o.source, identity: o.identity, remoteAt: o.remoteAt, ord: rows.length }
      known.set(o.identity, row)
      rows.push(row)
    }
  }
  return rows
}

/**
 * A Postgres array literal of integers (or NULLs), built in one pass: the driver would quote and
 * escape each element of a JavaScript array as if it were text, which for a batch of 10,000 cost as
 * much client time as the fold.
 */
const integers = (xs: ReadonlyArray<number | null>): string => `{${xs.map((x) => (x === null ? "NULL" : String(x))).join(",")}}`

const result = (batch: ReadonlyArray<Target.Observation>, rows: ReadonlyArray<Row>, inserted: ReadonlyArray<{ source: string; identity: string }>): Store.RecordResult => {
  // A cycle over known targets inserts nothing: no need to index the batch.
  if (inserted.length === 0) return { inserted: [], known: batch.length }
  const ordOf = new Map(rows.map((r) => [`${r.source}\u0000${r.identity}`, r.ord]))
  const identities = inserted
    .map((r) => ({ identity: r.identity, ord: ordOf.get(`${r.source}\u0000${r.identity}`) ?? 0 }))
    .sort((a, b) => a.ord - b.ord)
    .map((r) => r.identity)
  return { inserted: identities, known: batch.length - identities.length }
}

/**
 * Postgres: one statement for the whole batch. The arrays are unnested in batch
 * order (`WITH ORDINALITY` numbers them), so new ids follow the order of
 * discovery. Each identity is looked up once, by the unique index (a lateral
 * subquery, so the look-up is a probe per observation whatever the table's
 * size; a join here is planned as a hash over the whole table). A known
 * target whose observation is newer is updated by its id (a probe of the
 * primary key), an unchanged one is read and not written, and only the unknown
 * identities reach the `INSERT … ON CONFLICT`, each drawing the next id, so
 * ids count discovered targets (what a priority step counts, see core's
 * `Priority.step`). Given every observation, `ON CONFLICT` drew an id for
 * every row and locked every known one even when its `DO UPDATE … WHERE`
 * changed nothing (a cycle that re-observed a million targets spent a million
 * ids and wrote a million row locks); given the newer known ones, it still
 * probed the unique index a second time and logged a lock before each update
 * (56 bytes of WAL and about a tenth of the server's time per changed target,
 * performance.md, the seventeenth round). The `ON CONFLICT` merges an identity
 * another batch inserted after this statement's snapshot (at the cost of one
 * id; `GREATEST` ignores NULLs). `xmax = 0` marks the rows it inserted.
 *
 * Two batches upserting the same identities in different orders would lock
 * rows in different orders and deadlock; instead each batch first takes a
 * transaction-level advisory lock per source it names (in sorted order, in
 * the materialised input, read before any row is written), so concurrent
 * cycles of one source take turns, one short statement each.
 */
export const pg = (sql: SqlClient.SqlClient, batch: ReadonlyArray<Target.Observation>, now: number) =>
  Effect.gen(function* () {
    if (batch.length === 0) return { inserted: [], known: 0 }
    const rows = fold(batch)
    // each row's source as its 1-based position in the batch's sorted sources
    const sources = [...new Set(rows.map((r) => r.source))].sort()
    const position = new Map(sources.map((s, i) => [s, i + 1]))
    const out = yield* sql<{ source: string; identity: string }>`
      WITH i AS MATERIALIZED (
        SELECT u.source, u.identity, u.remote_at, u.ord, k.id AS known_id, k.observed_remote_at AS known_at
        FROM (
          SELECT (${sources}::text[])[x.position] AS source, x.identity, x.remote_at, x.ord
          FROM unnest(${integers(rows.map((r) => position.get(r.source)!))}::int[], ${rows.map((r) => r.identity)}::text[],
                      ${integers(rows.map((r) => r.remoteAt))}::bigint[]) WITH ORDINALITY AS x(position, identity, remote_at, ord)
        ) u
        LEFT JOIN LATERAL (
          SELECT t.id, t.observed_remote_at FROM targets t WHERE t.source = u.source AND t.identity = u.identity OFFSET 0
        ) AS k ON true
        WHERE (SELECT count(*) FROM (
          SELECT pg_advisory_xact_lock(hashtext('scanfleet.observe:' || s))
          FROM unnest(${sources}::text[]) AS l(s)) AS l) >= 0
      ), newer AS (
        UPDATE targets t SET observed_remote_at = GREATEST(t.observed_remote_at, i.remote_at)
        FROM i
        WHERE t.id = ANY (ARRAY(SELECT i.known_id FROM i WHERE i.remote_at IS NOT NULL AND (i.known_at IS NULL OR i.remote_at > i.known_at)))
          AND i.known_id = t.id AND (t.observed_remote_at IS NULL OR i.remote_at > t.observed_remote_at)
      ), fresh AS (
        INSERT INTO targets (id, source, identity, status, observed_remote_at, discovered_at) OVERRIDING SYSTEM VALUE
        SELECT nextval('targets_id_seq'::regclass), i.source, i.identity, 'pending', i.remote_at, ${now}::bigint
        FROM i
        WHERE i.known_id IS NULL
        ORDER BY i.ord
        ON CONFLICT (source, identity) DO UPDATE
          SET observed_remote_at = GREATEST(targets.observed_remote_at, EXCLUDED.observed_remote_at)
          WHERE EXCLUDED.observed_remote_at IS NOT NULL
            AND (targets.observed_remote_at IS NULL OR EXCLUDED.observed_remote_at > targets.observed_remote_at)
        RETURNING source, identity, (xmax = 0) AS inserted
      )
      SELECT source, identity FROM fresh WHERE inserted`
    return result(batch, rows, out)
  })

/**
 * SQLite: inside the caller's write transaction, one statement over the batch
 * as a JSON array. SQLite's two-argument `MAX()` returns NULL if either side is,
 * so the `WHERE` does the null handling. Rows with an id above the previous
 * maximum are the inserted ones (the write lock is held throughout).
 */
export const sqlite = (sql: SqlClient.SqlClient, batch: ReadonlyArray<Target.Observation>, now: number) =>
  Effect.gen(function* () {
    if (batch.length === 0) return { inserted: [], known: 0 }
    const rows = fold(batch)
    const [{ top }] = yield* sql<{ top: number }>`SELECT COALESCE(MAX(id), 0) AS top FROM targets`
    const doc = JSON.stringify(rows.map((r) => [r.source, r.identity, r.remoteAt]))
    const out = yield* sql<{ id: number; source: string; identity: string }>`
      INSERT INTO targets (source, identity, status, observed_remote_at, discovered_at)
      SELECT j.value ->> 0, j.value ->> 1, 'pending', j.value ->> 2, ${now}
      FROM json_each(${doc}) AS j WHERE true ORDER BY j.key
      ON CONFLICT (source, identity) DO UPDATE
        SET observed_remote_at = MAX(COALESCE(targets.observed_remote_at, excluded.observed_remote_at), excluded.observed_remote_at)
        WHERE excluded.observed_remote_at IS NOT NULL
          AND (targets.observed_remote_at IS NULL OR excluded.observed_remote_at > targets.observed_remote_at)
      RETURNING id, source, identity`
    return result(batch, rows, out.filter((r) => r.id > top))
  })
