import type { SqlClient, SqlError } from "@effect/sql"
import { Effect, Either } from "effect"
import { type Assignment, type Errors, type Store, WorkerWrite } from "@scanfleet/core"
import * as Codec from "../Codec.js"
import * as SqlFindingStore from "../../SqlFindingStore.js"

type Row = { readonly [column: string]: unknown }
type Event = WorkerWrite.StoredEvent

const targetJson = Codec.targetColumns
  .split(", ")
  .map((c) => `'${c}', t.${c}`)
  .join(", ")

/** A timeline as a JSON array of [seq, kind, phase, at, detail, accepted_at], decoded as Codec.event decodes a row. */
export const decodeTimeline = (v: unknown): ReadonlyArray<Event> =>
  (Codec.json<ReadonlyArray<readonly [unknown, unknown, unknown, unknown, unknown, unknown]> | null>(v ?? "[]") ?? []).map(([seq, kind, phase, at, detail, acceptedAt]) =>
    detail === null || detail === undefined
      ? { seq: Number(seq), kind: kind as Event["kind"], phase: phase as Event["phase"], at: Number(at), acceptedAt: Number(acceptedAt) }
      : { seq: Number(seq), kind: kind as Event["kind"], phase: phase as Event["phase"], at: Number(at), detail: String(detail), acceptedAt: Number(acceptedAt) }
  )

/**
 * SQLite, inside the caller's transaction: one statement takes the write lock
 * with a no-op update of the reservation and returns it with its target and its
 * timeline; core's WorkerWrite.judgeResult decides, then the writes of an accepted
 * result (target, result, durations, reservation, findings).
 */
export const sqlite = (
  sql: SqlClient.SqlClient,
  input: Store.ResultInput,
  insertDurations: (ds: ReadonlyArray<Assignment.Duration>) => Effect.Effect<void, SqlError.SqlError>
): Effect.Effect<Assignment.Receipt, Errors.ReservationRefused | SqlError.SqlError> =>
  Effect.gen(function* () {
    // ended_at is in no index, so the no-op update rewrites the row alone.
    const [row] = Number.isSafeInteger(input.reservationId)
      ? yield* sql<Row>`
          UPDATE assignments SET ended_at = ended_at WHERE reservation_id = ${input.reservationId}
          RETURNING ${sql.literal(Codec.assignmentColumns)},
            (SELECT json_object(${sql.literal(targetJson)}) FROM targets t WHERE t.id = assignments.target_id) AS target_row,
            (SELECT json_group_array(json_array(p.seq, p.kind, p.phase, p.at, p.detail, p.accepted_at) ORDER BY p.seq)
              FROM progress_events p WHERE p.reservation_id = assignments.reservation_id) AS timeline`
      : yield* sql<Row>`UPDATE targets SET fence = fence WHERE 0`
    const a = row && Codec.assignment(row)
    const judged = WorkerWrite.judgeResult(input, a, () => Codec.target(Codec.json<Row>(row.target_row)))
    if (Either.isLeft(judged)) return yield* Effect.fail(judged.left)
    if (judged.right._tag === "repeat") return judged.right.receipt
    return yield* writeAccepted(sql, input, a!, judged.right, decodeTimeline(row.timeline), insertDurations)
  })

/**
 * SQLite: the writes of an accepted result, after every check passed: the target's fenced
 * compare-and-set, the durations of the timeline, the reservation's end with its result
 * body (the receipt is derived from that row) and the result's findings.
 */
export const writeAccepted = (
  sql: SqlClient.SqlClient,
  input: Store.ResultInput,
  a: Assignment.Assignment,
  plan: WorkerWrite.ResultPlan,
  evs: ReadonlyArray<WorkerWrite.StoredEvent>,
  insertDurations: (ds: ReadonlyArray<Assignment.Duration>) => Effect.Effect<void, SqlError.SqlError>
): Effect.Effect<Assignment.Receipt, SqlError.SqlError> =>
  Effect.gen(function* () {
    const { receipt, targetStatus, state } = plan
    yield* targetStatus === "completed"
      ? sql`UPDATE targets SET status = 'completed', completed_at = ${input.now} WHERE id = ${a.targetId} AND status = 'in_progress' AND fence = ${a.fence}`
      : sql`UPDATE targets SET status = ${targetStatus} WHERE id = ${a.targetId} AND status = 'in_progress' AND fence = ${a.fence}`
    yield* insertDurations(WorkerWrite.durationsOfEnded(a, evs, input.outcome, input.now))
    yield* sql`UPDATE assignments SET state = ${state}, outcome = ${input.outcome},
      final_phase = ${input.finalPhase}, ended_at = ${input.now}, result_body = ${input.body} WHERE reservation_id = ${a.reservationId}`
    // Findings: related to the target's stored ones and written in this transaction, with the result.
    yield* SqlFindingStore.record(sql, SqlFindingStore.scanOf(input, a))
    return receipt
  })
