import type { SqlClient, SqlError } from "@effect/sql"
import { Effect, Either } from "effect"
import { Assignment, Claim, type Errors, type PhaseModel, type Store, type Target } from "@scanfleet/core"
import * as Codec from "../Codec.js"
import * as Rules from "../Rules.js"
import * as SqlFindingStore from "../../SqlFindingStore.js"

type Row = { readonly [column: string]: unknown }
type Event = PhaseModel.Event & { readonly acceptedAt: number }

const targetJson = Codec.targetColumns
  .split(", ")
  .map((c) => `'${c}', t.${c}`)
  .join(", ")

// The timeline as [seq, kind, phase, at, detail, accepted_at], decoded as Codec.event decodes a row.
const decodeTimeline = (v: unknown): ReadonlyArray<Event> =>
  (Codec.json<ReadonlyArray<readonly [unknown, unknown, unknown, unknown, unknown, unknown]> | null>(v ?? "[]") ?? []).map(([seq, kind, phase, at, detail, acceptedAt]) =>
    detail === null || detail === undefined
      ? { seq: Number(seq), kind: kind as Event["kind"], phase: phase as Event["phase"], at: Number(at), acceptedAt: Number(acceptedAt) }
      : { seq: Number(seq), kind: kind as Event["kind"], phase: phase as Event["phase"], at: Number(at), detail: String(detail), acceptedAt: Number(acceptedAt) }
  )

/**
 * SQLite, inside the caller's transaction: one statement takes the write lock
 * with a no-op update of the reservation and returns it with its prior result,
 * its target and its timeline; the decisions follow in core's order, then the
 * writes of an accepted result (target, result, durations, reservation).
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
          RETURNING *,
            (SELECT json_array(r.receipt_id, r.outcome, r.accepted_at) FROM results r WHERE r.reservation_id = assignments.reservation_id) AS prior_result,
            (SELECT json_object(${sql.literal(targetJson)}) FROM targets t WHERE t.id = assignments.target_id) AS target_row,
            (SELECT json_group_array(json_array(p.seq, p.kind, p.phase, p.at, p.detail, p.accepted_at) ORDER BY p.seq)
              FROM progress_events p WHERE p.reservation_id = assignments.reservation_id) AS timeline`
      : yield* sql<Row>`UPDATE targets SET fence = fence WHERE 0`
    const owned = Rules.authorize(input, row && Codec.assignment(row))
    if (Either.isLeft(owned)) return yield* Effect.fail(owned.left)
    const a = owned.right
    // authorize found the reservation, so the statement returned its row
    const found = row as Row
    if (found.prior_result !== null && found.prior_result !== undefined) {
      const [receiptId, outcome, acceptedAt] = Codec.json<readonly [string, string, number]>(found.prior_result)
      return Codec.receipt({ receipt_id: receiptId, reservation_id: a.reservationId, outcome, accepted_at: acceptedAt })
    }
    const live = Rules.requireLive(a, input.now)
    if (Either.isLeft(live)) return yield* Effect.fail(live.left)
    if (input.now > a.uploadDeadline)
      return yield* Rules.refuse("upload_deadline_passed", a.reservationId, `the result-upload deadline passed at ${new Date(a.uploadDeadline).toISOString()}`)
    const t = Codec.target(Codec.json<Row>(found.target_row))
    if (!Claim.holds(t, a.fence)) return yield* Rules.lostTarget(a, t.id)
    return yield* writeAccepted(sql, input, a, t, decodeTimeline(found.timeline), insertDurations)
  })

/**
 * The writes of an accepted result, after every check passed: the target's fenced
 * compare-and-set, the receipt, the durations of the timeline and the reservation's
 * end. Shared by SQLite and by the Postgres transaction the one-statement path falls
 * back to.
 */
export const writeAccepted = (
  sql: SqlClient.SqlClient,
  input: Store.ResultInput,
  a: Assignment.Assignment,
  t: Target.Target,
  evs: ReadonlyArray<Event>,
  insertDurations: (ds: ReadonlyArray<Assignment.Duration>) => Effect.Effect<void, SqlError.SqlError>
): Effect.Effect<Assignment.Receipt, SqlError.SqlError> =>
  Effect.gen(function* () {
    const status = Assignment.targetStatusAfter(input.outcome)
    yield* status === "completed"
      ? sql`UPDATE targets SET status = 'completed', completed_at = ${input.now} WHERE id = ${t.id} AND status = 'in_progress' AND fence = ${a.fence}`
      : sql`UPDATE targets SET status = ${status} WHERE id = ${t.id} AND status = 'in_progress' AND fence = ${a.fence}`
    const receipt: Assignment.Receipt = { receiptId: `rc-${a.reservationId}-${a.fence}`, reservationId: a.reservationId, outcome: input.outcome, acceptedAt: input.now }
    yield* sql`INSERT INTO results (reservation_id, receipt_id, outcome, accepted_at, body)
      VALUES (${a.reservationId}, ${receipt.receiptId}, ${receipt.outcome}, ${receipt.acceptedAt}, ${input.body})`
    // Findings: related and written in this transaction, with the result.
    yield* SqlFindingStore.record(sql, { reservationId: a.reservationId, targetId: t.id, source: a.source, identity: a.identity, coveredRemoteAt: a.coveredRemoteAt, outcome: input.outcome, now: input.now, body: input.body })
    const uploading = evs.find((e) => e.kind === "phase" && e.phase === "uploading")
    yield* insertDurations(Assignment.durationsOf(a, evs, input.outcome, input.now, uploading ? uploading.acceptedAt : null))
    yield* sql`UPDATE assignments SET state = ${status === "completed" ? "completed" : "failed"}, outcome = ${input.outcome},
      final_phase = ${input.finalPhase}, ended_at = ${input.now} WHERE reservation_id = ${a.reservationId}`
    return receipt
  })
