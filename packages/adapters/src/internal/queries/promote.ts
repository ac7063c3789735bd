import type { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import { Promotion, type Source, type Store } from "@scanfleet/core"

// Core's rule (Promotion.decide) as a predicate: completed, a valid observation
// strictly newer than the coverage basis (the claimed snapshot, or completion for
// legacy rows), and the cooldown elapsed since the last scan. NULL comparisons
// are false, so rows without an observation or a basis never qualify. The first
// three terms are the predicate of `targets_promotion_idx` and the cooldown is a
// range on its second column, so both the pick and the bounded count read that
// index alone and stop after the rows they need.
const eligible = (sql: SqlClient.SqlClient, source: Source.Source, cooldownMs: number, now: number) => sql`
  source = ${source}
  AND status = 'completed'
  AND observed_remote_at IS NOT NULL
  AND observed_remote_at > COALESCE(covered_remote_at, completed_at)
  AND ${cooldownRange(sql, now - cooldownMs)}`

// Bases are integers, so `now - basis >= cooldown` is `basis <= floor(now - cooldown)`.
// Like core's comparison, a NaN bound never holds a target back.
const cooldownRange = (sql: SqlClient.SqlClient, bound: number) =>
  Number.isNaN(bound) || bound >= Number.MAX_SAFE_INTEGER
    ? sql`1 = 1`
    : bound <= Number.MIN_SAFE_INTEGER
      ? sql`1 = 0`
      : sql`COALESCE(last_scan_started_at, completed_at, 0) <= ${Math.floor(bound)}`

interface Moved {
  readonly identity: string
  readonly id: number
  readonly basis: number
}

// Core's order: stalest scan first, then lowest id.
const ordered = (moved: ReadonlyArray<Moved>) =>
  [...moved].sort((a, b) => a.basis - b.basis || a.id - b.id).map((m) => m.identity)

// The count reads at most budget + limit eligible rows: enough to tell how many the
// budget left, up to the limit, whatever the table's size.
const countCap = (budget: number, rule: Store.PromoteRule) => {
  const limit = rule.deferredLimit === undefined || Number.isNaN(rule.deferredLimit) ? Promotion.deferredCountLimit : Math.max(0, Math.floor(rule.deferredLimit))
  const cap = budget + limit
  return Number.isSafeInteger(cap) ? cap : null
}

/**
 * Postgres: one statement. Candidates are locked in core's order with
 * `SKIP LOCKED`, so a concurrent cycle skips rows another is promoting; a row
 * changed and committed meanwhile is re-checked against the predicate, and the
 * compare-and-set on (status, fence) promotes a covered revision at most once.
 */
export const pg = (sql: SqlClient.SqlClient, source: Source.Source, rule: Store.PromoteRule, now: number) =>
  Effect.gen(function* () {
    const budget = Math.max(0, Math.floor(rule.budget))
    const cap = countCap(budget, rule)
    const [row] = yield* sql<{ eligible: number; moved: ReadonlyArray<readonly [string, number, number]> }>`
      WITH picked AS (
        SELECT id, fence FROM targets
        WHERE ${eligible(sql, source, rule.cooldownMs, now)}
        ORDER BY COALESCE(last_scan_started_at, completed_at, 0), id
        LIMIT ${budget}
        FOR UPDATE SKIP LOCKED
      ), moved AS (
        UPDATE targets t SET status = 'pending', fence = t.fence + 1, attempts = 0 -- a fresh expiry budget (core's Retry)
        FROM picked p
        WHERE t.id = p.id AND t.status = 'completed' AND t.fence = p.fence
        RETURNING t.identity, t.id, COALESCE(t.last_scan_started_at, t.completed_at, 0) AS basis
      )
      SELECT
        (SELECT count(*) FROM (
          SELECT 1 FROM targets WHERE ${eligible(sql, source, rule.cooldownMs, now)}${cap === null ? sql.literal("") : sql` LIMIT ${cap}`}
        ) e) AS eligible,
        COALESCE((SELECT json_agg(json_build_array(identity, basis, id)) FROM moved), '[]'::json) AS moved`
    const moved = row.moved.map(([identity, basis, id]) => ({ identity, basis: Number(basis), id: Number(id) }))
    return { promoted: ordered(moved), deferred: Promotion.deferredCount(Number(row.eligible) - moved.length, rule.deferredLimit) } satisfies Store.PromoteResult
  })

/** SQLite: inside the caller's write transaction, one bounded count and one fenced update. */
export const sqlite = (sql: SqlClient.SqlClient, source: Source.Source, rule: Store.PromoteRule, now: number) =>
  Effect.gen(function* () {
    const budget = Math.max(0, Math.floor(rule.budget))
    const cap = countCap(budget, rule)
    const [{ n }] = yield* sql<{ n: number }>`
      SELECT count(*) AS n FROM (
        SELECT 1 FROM targets WHERE ${eligible(sql, source, rule.cooldownMs, now)}${cap === null ? sql.literal("") : sql` LIMIT ${cap}`}
      )`
    const moved = yield* sql<Moved>`
      UPDATE targets SET status = 'pending', fence = fence + 1, attempts = 0 -- a fresh expiry budget (core's Retry)
      WHERE status = 'completed' AND id IN (
        SELECT id FROM targets
        WHERE ${eligible(sql, source, rule.cooldownMs, now)}
        ORDER BY COALESCE(last_scan_started_at, completed_at, 0), id
        LIMIT ${budget}
      )
      RETURNING identity, id, COALESCE(last_scan_started_at, completed_at, 0) AS basis`
    return { promoted: ordered(moved), deferred: Promotion.deferredCount(Number(n) - moved.length, rule.deferredLimit) } satisfies Store.PromoteResult
  })
