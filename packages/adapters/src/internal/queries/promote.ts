import type { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import { type Source, type Store } from "@scanfleet/core"

// Core's rule (Promotion.decide) as a predicate: completed, a valid observation
// strictly newer than the coverage basis (the claimed snapshot, or completion for
// legacy rows), and the cooldown elapsed since the last scan. NULL comparisons
// are false, so rows without an observation or a basis never qualify.
const eligible = (sql: SqlClient.SqlClient, source: Source.Source, cooldownMs: number, now: number) => sql`
  source = ${source}
  AND status = 'completed'
  AND observed_remote_at IS NOT NULL
  AND observed_remote_at > COALESCE(covered_remote_at, completed_at)
  AND CAST(${now} AS DOUBLE PRECISION) - COALESCE(last_scan_started_at, completed_at, 0) >= CAST(${cooldownMs} AS DOUBLE PRECISION)`

interface Moved {
  readonly identity: string
  readonly id: number
  readonly basis: number
}

// Core's order: stalest scan first, then lowest id.
const ordered = (moved: ReadonlyArray<Moved>) =>
  [...moved].sort((a, b) => a.basis - b.basis || a.id - b.id).map((m) => m.identity)

/**
 * Postgres: one statement. Candidates are locked in core's order with
 * `SKIP LOCKED`, so a concurrent cycle skips rows another is promoting; a row
 * changed and committed meanwhile is re-checked against the predicate, and the
 * compare-and-set on (status, fence) promotes a covered revision at most once.
 */
export const pg = (sql: SqlClient.SqlClient, source: Source.Source, rule: { readonly budget: number; readonly cooldownMs: number }, now: number) =>
  Effect.gen(function* () {
    const budget = Math.max(0, Math.floor(rule.budget))
    const [row] = yield* sql<{ eligible: number; moved: ReadonlyArray<readonly [string, number, number]> }>`
      WITH picked AS (
        SELECT id, fence FROM targets
        WHERE ${eligible(sql, source, rule.cooldownMs, now)}
        ORDER BY COALESCE(last_scan_started_at, completed_at, 0), id
        LIMIT ${budget}
        FOR UPDATE SKIP LOCKED
      ), moved AS (
        UPDATE targets t SET status = 'pending', fence = t.fence + 1
        FROM picked p
        WHERE t.id = p.id AND t.status = 'completed' AND t.fence = p.fence
        RETURNING t.identity, t.id, COALESCE(t.last_scan_started_at, t.completed_at, 0) AS basis
      )
      SELECT
        (SELECT count(*) FROM targets WHERE ${eligible(sql, source, rule.cooldownMs, now)}) AS eligible,
        COALESCE((SELECT json_agg(json_build_array(identity, basis, id)) FROM moved), '[]'::json) AS moved`
    const moved = row.moved.map(([identity, basis, id]) => ({ identity, basis: Number(basis), id: Number(id) }))
    return { promoted: ordered(moved), deferred: Number(row.eligible) - moved.length } satisfies Store.PromoteResult
  })

/** SQLite: inside the caller's write transaction, one count and one fenced update. */
export const sqlite = (sql: SqlClient.SqlClient, source: Source.Source, rule: { readonly budget: number; readonly cooldownMs: number }, now: number) =>
  Effect.gen(function* () {
    const budget = Math.max(0, Math.floor(rule.budget))
    const [{ n }] = yield* sql<{ n: number }>`SELECT count(*) AS n FROM targets WHERE ${eligible(sql, source, rule.cooldownMs, now)}`
    const moved = yield* sql<Moved>`
      UPDATE targets SET status = 'pending', fence = fence + 1
      WHERE status = 'completed' AND id IN (
        SELECT id FROM targets
        WHERE ${eligible(sql, source, rule.cooldownMs, now)}
        ORDER BY COALESCE(last_scan_started_at, completed_at, 0), id
        LIMIT ${budget}
      )
      RETURNING identity, id, COALESCE(last_scan_started_at, completed_at, 0) AS basis`
    return { promoted: ordered(moved), deferred: n - moved.length } satisfies Store.PromoteResult
  })
