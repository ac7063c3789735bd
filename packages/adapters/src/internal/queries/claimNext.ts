import type { SqlClient, Statement } from "@effect/sql"
import { Effect } from "effect"
import { Priority, Source, type Target } from "@scanfleet/core"
import * as Codec from "../Codec.js"

/**
 * Takes the first pending target in claim order (`Priority.compare`; within the allowed sources and under the
 * per-source in-flight cap) and applies core's claim in the same statement:
 * `covered_remote_at` := `observed_remote_at` as it is now, fence and attempts
 * bumped, scan start stamped. On Postgres the candidate is locked with
 * `SKIP LOCKED`, so concurrent claimers never wait on each other nor take the
 * same row; SQLite runs it under the write lock of its transaction.
 */
export const claimNext = (
  sql: SqlClient.SqlClient,
  req: { readonly now: number; readonly sources?: ReadonlyArray<Source.Source>; readonly sourceCap?: number },
  postgres: boolean
) =>
  Effect.map(claimStatement(sql, req, postgres), (rows) =>
    rows.length === 0 ? null : (Codec.target(rows[0]) satisfies Target.Target)
  )

/**
 * Takes up to `limit` lowest-id pending targets at once, as `claimNext` takes one (rows in no
 * particular order). The per-source cap is checked against the assignments stored before the
 * statement, so a capped batch must be claimed one target at a time instead.
 */
export const claimBatch = (
  sql: SqlClient.SqlClient,
  req: { readonly now: number; readonly sources?: ReadonlyArray<Source.Source> },
  postgres: boolean,
  limit: number
) => Effect.map(claimStatement(sql, req, postgres, limit), (rows) => rows.map((r) => Codec.target(r) satisfies Target.Target))

/**
 * The statement of `claimNext` (or of `claimBatch` with a `limit`). On Postgres the pick is
 * `scanfleet_claimable` (migration 0013), the claims' one pick: from the claim head, in claim
 * order, locked with SKIP LOCKED, over the allowed sources less those at the cap, so a capped claim
 * skips the entries claimed targets left at the head of the claim index as the others do. SQLite
 * picks in the same order under its write lock.
 */
const claimStatement = (
  sql: SqlClient.SqlClient,
  req: { readonly now: number; readonly sources?: ReadonlyArray<Source.Source>; readonly sourceCap?: number },
  postgres: boolean,
  limit = 1
) => {
  const n = sql.literal(String(Math.max(0, Math.floor(limit))))
  // A source without active assignments has no group below, so a cap of zero or less must exclude everything here.
  const none = req.sources?.length === 0 || (req.sourceCap !== undefined && req.sourceCap <= 0)
  const atCap = req.sourceCap === undefined || none ? undefined : sql`
      SELECT a.source FROM assignments a WHERE a.state = 'active' GROUP BY a.source HAVING count(*) >= CAST(${req.sourceCap} AS DOUBLE PRECISION)`
  let ids: Statement.Fragment
  if (postgres) {
    const sources = req.sources ?? Source.sources
    const allowed = none ? sql`ARRAY[]::text[]` : atCap
      ? sql`ARRAY(SELECT s FROM unnest(${sources}::text[]) AS s WHERE s NOT IN (${atCap}))`
      : sql`${sources}::text[]`
    // an array built once keeps the plan an index probe per id rather than a join
    ids = sql`id = ANY (ARRAY(SELECT c.id FROM scanfleet_claimable(${allowed}, ${n}) c))`
  } else {
    const filters: Array<Statement.Fragment> = [sql`c.status = 'pending'`]
    if (none) filters.push(sql`1 = 0`)
    else {
      if (req.sources) filters.push(sql`c.source IN ${sql.in(req.sources)}`)
      if (atCap) filters.push(sql`c.source NOT IN (${atCap})`)
    }
    const pick = sql`
      SELECT c.id FROM targets c
      WHERE ${sql.and(filters)}
      ORDER BY ${sql.literal(Priority.claimKeySql("c"))}, c.id
      LIMIT ${n}`
    ids = limit === 1 ? sql`id = (${pick})` : sql`id IN (${pick})`
  }
  return sql`
    UPDATE targets SET
      status = 'in_progress',
      covered_remote_at = observed_remote_at,
      fence = fence + 1,
      last_scan_started_at = ${req.now},
      attempts = attempts + 1
    WHERE status = 'pending' AND ${ids}
    RETURNING ${sql.literal(Codec.targetColumns)}`
}
