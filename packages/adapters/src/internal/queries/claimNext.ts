import type { SqlClient, Statement } from "@effect/sql"
import { Effect } from "effect"
import { Priority, type Source, type Target } from "@scanfleet/core"
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
  skipLocked: boolean
) =>
  Effect.map(claimStatement(sql, req, skipLocked), (rows) =>
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
  skipLocked: boolean,
  limit: number
) => Effect.map(claimStatement(sql, req, skipLocked, undefined, limit), (rows) => rows.map((r) => Codec.target(r) satisfies Target.Target))

/** The statement of `claimNext` (or of `claimBatch` with a `limit`); `gate`, when given, must hold for any target to be taken (a CTE may embed it). */
export const claimStatement = (
  sql: SqlClient.SqlClient,
  req: { readonly now: number; readonly sources?: ReadonlyArray<Source.Source>; readonly sourceCap?: number },
  skipLocked: boolean,
  gate?: Statement.Fragment,
  limit = 1
) => {
  const filters: Array<Statement.Fragment> = [sql`c.status = 'pending'`]
  if (gate) filters.push(gate)
  if (req.sources) filters.push(req.sources.length === 0 ? sql`1 = 0` : sql`c.source IN ${sql.in(req.sources)}`)
  // A source without active assignments has no group below, so a cap of zero or less must exclude everything here.
  if (req.sourceCap !== undefined && req.sourceCap <= 0) filters.push(sql`1 = 0`)
  else if (req.sourceCap !== undefined)
    filters.push(sql`c.source NOT IN (
      SELECT a.source FROM assignments a WHERE a.state = 'active' GROUP BY a.source HAVING count(*) >= CAST(${req.sourceCap} AS DOUBLE PRECISION))`)
  const pick = sql`
      SELECT c.id FROM targets c
      WHERE ${sql.and(filters)}
      ORDER BY ${sql.literal(Priority.claimKeySql("c"))}, c.id
      LIMIT ${sql.literal(String(Math.max(0, Math.floor(limit))))}${skipLocked ? sql.literal(" FOR UPDATE SKIP LOCKED") : sql.literal("")}`
  // Several ids: an array built once (Postgres) keeps the plan an index probe per id rather than a join.
  const ids = limit === 1 ? sql`id = (${pick})` : skipLocked ? sql`id = ANY (ARRAY(${pick}))` : sql`id IN (${pick})`
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
