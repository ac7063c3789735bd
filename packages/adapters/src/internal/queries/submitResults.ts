import type { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import { type Assignment, type Store, WorkerWrite } from "@scanfleet/core"
import * as Prepared from "../Prepared.js"

/**
 * Postgres: accepts any number of results in one statement of fixed text (columns as
 * arrays). Each reservation row is locked (in id order, so concurrent batches cannot
 * deadlock) and must still be the caller's live one within its result-upload deadline;
 * the target moves under a compare-and-set on (status, fence); the reservation ends with
 * its result body on its own row and joins the pending list its durations are folded
 * from later. The writes are core's WorkerWrite.resultPlan. Returns the receipts of the
 * results it accepted; every other input (a refusal, a repeat, a race) is left for the
 * caller to judge one by one. Each reservation may appear once. The statement writes no
 * findings: unless the caller is `relating` (it writes them itself in the same transaction), it
 * declines a result for a target with open findings, and callers leave results that carry
 * findings (core's `Findings.carriesFindings`) to the transactional path.
 */
export const acceptMany = (sql: SqlClient.SqlClient, inputs: ReadonlyArray<Store.ResultInput>, relating = false) => {
  const { ctes, receipts } = steps(sql, inputs, relating)
  return Effect.map(
    sql<{ reservation_id: number }>`${sql.literal(Prepared.marker)}
      WITH ${ctes}
      SELECT reservation_id FROM u`,
    (rows) => new Map(rows.map((r) => [Number(r.reservation_id), receipts.get(Number(r.reservation_id))!]))
  )
}

/**
 * The common table expressions of `acceptMany`, for a statement that goes on from them (`u`
 * holds the `reservation_id` and `device_id` of each reservation a result ended), and the receipt
 * each input gets if accepted, by reservation id.
 */
export const steps = (sql: SqlClient.SqlClient, inputs: ReadonlyArray<Store.ResultInput>, relating: boolean) => {
  const plans = inputs.map((i) => WorkerWrite.resultPlan(i, i.outcome, i.now))
  const receipts = new Map<number, Assignment.Receipt>(plans.map((p) => [p.receipt.reservationId, p.receipt]))
  const ctes = sql`inp AS (
        SELECT * FROM unnest(${inputs.map((i) => i.reservationId)}::bigint[], ${inputs.map((i) => i.deviceId)}::bigint[], ${inputs.map((i) => i.fence)}::bigint[],
          ${inputs.map((i) => i.now)}::bigint[], ${inputs.map((i) => i.outcome)}::text[], ${inputs.map((i) => i.finalPhase)}::text[],
          ${inputs.map((i) => i.body)}::text[], ${plans.map((p) => p.targetStatus)}::text[], ${plans.map((p) => p.state)}::text[])
          AS i(reservation_id, device_id, fence, now, outcome, final_phase, body, target_status, state)
      ), a AS (
        -- Each input finds its reservation by primary key, whatever the statistics: a lateral
        -- subquery that locks is never pulled up into a join, so it runs once per input as a
        -- probe of the key, the inputs in id order (concurrent batches lock in one order). As a
        -- join, planned on the statistics of a young table, it was a hash join over a sequential
        -- scan of every reservation, the filters below evaluated on each (2.4 ms instead of 0.4
        -- for 8 results over 1,300 reservations, in 256 of workload 1's first 375 statements).
        -- Device and state are compared with IS NOT DISTINCT FROM (both are NOT NULL), which no
        -- index serves and no partial index's predicate follows from, so that no plan walks a
        -- device's active reservations (assignments_active_slot_idx) or all active ones (the
        -- expiry index) instead.
        SELECT s.reservation_id, s.target_id, s.fence, i.now, i.outcome, i.final_phase, i.body, i.target_status, i.state
        FROM (SELECT * FROM inp ORDER BY reservation_id) i
        CROSS JOIN LATERAL (
          SELECT s.reservation_id, s.target_id, s.fence FROM assignments s
          WHERE s.reservation_id = i.reservation_id AND s.device_id IS NOT DISTINCT FROM i.device_id AND s.fence = i.fence
            AND s.state IS NOT DISTINCT FROM 'active' AND s.expires_at > i.now AND s.upload_deadline >= i.now
            -- a target with open findings is related by the transactional path, which writes findings
            AND (${relating}::bool OR NOT EXISTS (SELECT 1 FROM findings f WHERE f.target_id = s.target_id AND f.status <> 'resolved'))
          FOR UPDATE OF s
        ) s
      ), t AS (
        UPDATE targets SET status = a.target_status, completed_at = CASE WHEN a.target_status = 'completed' THEN a.now ELSE targets.completed_at END
        FROM a WHERE targets.id = a.target_id AND targets.status = 'in_progress' AND targets.fence = a.fence
        RETURNING a.*
      ), u AS (
        UPDATE assignments SET state = t.state, outcome = t.outcome, final_phase = t.final_phase, ended_at = t.now, result_body = t.body
        FROM t WHERE assignments.reservation_id = t.reservation_id
        RETURNING assignments.reservation_id, assignments.device_id
      ), p AS (
        INSERT INTO duration_pending (reservation_id) SELECT reservation_id FROM u
      )`
  return { ctes, receipts }
}
