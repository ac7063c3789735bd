import type { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import { Assignment, type Store } from "@scanfleet/core"
import * as Prepared from "../Prepared.js"

/**
 * Postgres: accepts many results in one statement, each exactly as the one-result fast path
 * accepts one. A reservation row is locked (in id order, so concurrent batches cannot deadlock)
 * and must be the version in the statement's snapshot, so its timeline, read for durations, is
 * current; the target moves under a compare-and-set on (status, fence). Returns the receipts of
 * the results it accepted; every other input (a refusal, a repeat, a race) is left for the
 * caller to judge one by one. Each reservation may appear once.
 */
export const acceptMany = (sql: SqlClient.SqlClient, inputs: ReadonlyArray<Store.ResultInput>) => {
  const receipts = new Map<number, Assignment.Receipt>(
    inputs.map((i) => [i.reservationId, { receiptId: `rc-${i.reservationId}-${i.fence}`, reservationId: i.reservationId, outcome: i.outcome, acceptedAt: i.now }])
  )
  const ids = inputs.map((i) => i.reservationId)
  return Effect.map(
    sql<{ reservation_id: number }>`${sql.literal(Prepared.marker)}
      WITH inp AS (
        SELECT * FROM unnest(${ids}::bigint[], ${inputs.map((i) => i.deviceId)}::bigint[], ${inputs.map((i) => i.fence)}::bigint[],
          ${inputs.map((i) => i.now)}::bigint[], ${inputs.map((i) => i.outcome)}::text[], ${inputs.map((i) => i.finalPhase)}::text[],
          ${inputs.map((i) => i.body)}::text[], ${inputs.map((i) => receipts.get(i.reservationId)!.receiptId)}::text[],
          ${inputs.map((i) => Assignment.targetStatusAfter(i.outcome))}::text[])
          AS i(reservation_id, device_id, fence, now, outcome, final_phase, body, receipt_id, target_status)
      ), locked AS (
        SELECT a.reservation_id, a.xmin::text AS v FROM assignments a JOIN inp i ON i.reservation_id = a.reservation_id
        WHERE a.device_id = i.device_id AND a.fence = i.fence AND a.state = 'active' AND a.expires_at > i.now AND a.upload_deadline >= i.now
          -- a target with open findings is related by the transactional path
          AND NOT EXISTS (SELECT 1 FROM findings f WHERE f.target_id = a.target_id AND f.status <> 'resolved')
        ORDER BY a.reservation_id
        FOR UPDATE OF a
      ), a AS (
        SELECT s.reservation_id, s.target_id, s.source, s.issued_at, s.fence, i.now, i.outcome, i.final_phase, i.body, i.receipt_id, i.target_status
        FROM locked l JOIN assignments s ON s.reservation_id = l.reservation_id AND s.xmin::text = l.v JOIN inp i ON i.reservation_id = l.reservation_id
      ), t AS (
        UPDATE targets SET status = a.target_status, completed_at = CASE WHEN a.target_status = 'completed' THEN a.now ELSE targets.completed_at END
        FROM a WHERE targets.id = a.target_id AND targets.status = 'in_progress' AND targets.fence = a.fence
        RETURNING a.*
      ), r AS (
        INSERT INTO results (reservation_id, receipt_id, outcome, accepted_at, body)
        SELECT reservation_id, receipt_id, outcome, now, body FROM t
      ), u AS (
        UPDATE assignments SET state = CASE WHEN t.target_status = 'completed' THEN 'completed' ELSE 'failed' END, outcome = t.outcome,
          final_phase = t.final_phase, ended_at = t.now
        FROM t WHERE assignments.reservation_id = t.reservation_id
      ), ev AS (
        -- Spans as core's PhaseModel.spans builds them: recovery events do not split a phase.
        SELECT e.reservation_id, e.seq, e.phase, e.at, e.accepted_at, lead(e.phase) OVER w AS next_phase, lead(e.at) OVER w AS next_at
        FROM progress_events e WHERE e.reservation_id = ANY (${ids}::bigint[]) AND e.kind <> 'recovered'
        WINDOW w AS (PARTITION BY e.reservation_id ORDER BY e.seq)
      ), d AS (
        SELECT t.reservation_id, 0 AS k, 0 AS seq, t.source, 'end_to_end' AS metric, t.outcome, t.now, GREATEST(0, t.now - t.issued_at)::float8 AS ms FROM t
        UNION ALL
        SELECT t.reservation_id, 1, ev.seq, t.source, ev.phase, t.outcome, t.now, GREATEST(0, ev.next_at - ev.at)::float8
        FROM t JOIN ev ON ev.reservation_id = t.reservation_id
        WHERE ev.phase IN ('scanning', 'cleanup', 'bundling') AND ev.next_phase IS NOT NULL AND ev.next_phase NOT IN ('completed', 'timed_out', 'failed')
        UNION ALL
        SELECT t.reservation_id, 2, 0, t.source, 'upload', t.outcome, t.now, GREATEST(0, t.now - up.accepted_at)::float8
        FROM t JOIN LATERAL (SELECT ev.accepted_at FROM ev WHERE ev.reservation_id = t.reservation_id AND ev.phase = 'uploading' ORDER BY ev.seq LIMIT 1) up ON true
      ), ins AS (
        INSERT INTO durations (source, metric, outcome, ms, at)
        SELECT source, metric, outcome, ms, now FROM d ORDER BY reservation_id, k, seq
      )
      SELECT reservation_id FROM t`,
    (rows) => new Map(rows.map((r) => [Number(r.reservation_id), receipts.get(Number(r.reservation_id))!]))
  )
}
