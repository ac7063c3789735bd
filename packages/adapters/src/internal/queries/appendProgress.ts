import type { SqlClient, SqlError } from "@effect/sql"
import { Effect, Either } from "effect"
import { type Assignment, type Errors, PhaseModel, type Store } from "@scanfleet/core"
import * as Codec from "../Codec.js"
import * as Prepared from "../Prepared.js"
import * as Rules from "../Rules.js"

type Row = { readonly [column: string]: unknown }
type Auth = Store.Authority
type Outcome = { readonly results: ReadonlyArray<Store.Acceptance>; readonly assignment: Assignment.Assignment }
type Refusal = Errors.ReservationRefused | Errors.ProgressRejected

const isId = (n: number) => Number.isSafeInteger(n)

/**
 * A batch planned without reading: what it stores if the reservation is live and
 * its timeline ends exactly before the batch's first event, in one of `phases`.
 * Only the first event depends on the stored phase (the model sets the phase from
 * it on), so one plan answers for every phase in the list; anything else about
 * the stored state is left to a read.
 */
export interface Speculation {
  readonly priorSeq: number
  /** The stored last phases under which the plan holds; "" stands for none yet. */
  readonly phases: ReadonlyArray<string>
  readonly plan: Rules.ProgressPlan
}

const priors: ReadonlyArray<PhaseModel.Phase | null> = [null, ...PhaseModel.phases]

/** The speculative plan of a batch whose first event is new, or null when none holds. */
export const speculate = (reservationId: number, batch: ReadonlyArray<PhaseModel.Event>, now: number): Speculation | null => {
  if (batch.length === 0 || !batch.every((e) => isId(e.seq))) return null
  const first = batch[0]
  const priorSeq = first.seq - 1
  if (priorSeq < 0) return null
  const phases = priors.filter((p) => Either.isRight(PhaseModel.append({ events: [], phase: p, lastSeq: priorSeq }, first)))
  if (phases.length === 0) return null
  // Only the fields the plan reads: a live reservation whose timeline stops at priorSeq.
  const assumed = { reservationId, state: "active", expiresAt: Number.POSITIVE_INFINITY, lastPhase: phases[0], lastSeq: priorSeq } as Assignment.Assignment
  const plan = Rules.planProgress(assumed, [], batch, now)
  return Either.isRight(plan) ? { priorSeq, phases: phases.map((p) => p ?? ""), plan: plan.right } : null
}

type StoredEvent = Rules.ProgressPlan["fresh"][number]

// Stored events as [seq, kind, phase, at, detail, accepted_at], decoded as Codec.event
// decodes a row, but field by field (a spread per event costs more than the rest).
const decodeStored = (v: unknown): ReadonlyArray<StoredEvent> =>
  (Codec.json<ReadonlyArray<readonly [unknown, unknown, unknown, unknown, unknown, unknown]> | null>(v ?? "[]") ?? []).map(([seq, kind, phase, at, detail, acceptedAt]) =>
    detail === null || detail === undefined
      ? { seq: Number(seq), kind: kind as StoredEvent["kind"], phase: phase as StoredEvent["phase"], at: Number(at), acceptedAt: Number(acceptedAt) }
      : { seq: Number(seq), kind: kind as StoredEvent["kind"], phase: phase as StoredEvent["phase"], at: Number(at), detail: String(detail), acceptedAt: Number(acceptedAt) }
  )

/** Plans a batch against what was read: the assignment row and the stored events of the batch's sequences. */
const planRead = (auth: Auth, batch: ReadonlyArray<PhaseModel.Event>, row: Row | undefined) =>
  Either.flatMap(Rules.authorize(auth, row && Codec.assignment(row)), (a) =>
    Either.map(Rules.planProgress(a, decodeStored(row?.stored_events), batch, auth.now), (plan) => ({ a, plan }))
  )

const readSeqs = (batch: ReadonlyArray<PhaseModel.Event>) => [...new Set(batch.map((e) => e.seq))].filter(isId)

const storedOf = (sql: SqlClient.SqlClient, seqs: ReadonlyArray<number>) =>
  sql`(
    SELECT COALESCE(json_agg(json_build_array(p.seq, p.kind, p.phase, p.at, p.detail, p.accepted_at)), '[]'::json)
    FROM progress_events p WHERE p.reservation_id = s.reservation_id AND p.seq = ANY(${seqs}::bigint[])
  )`

// Writes the planned events and the reservation's new state, gated under the reservation's
// row lock on the state the plan assumed; the row comes back with `applied` when it held.
// With `read`, a reservation that failed the gate comes back as read in the statement's
// snapshot, with its stored events of those sequences.
const pgWrite = (
  sql: SqlClient.SqlClient,
  auth: Auth,
  gate: { readonly priorSeq: number; readonly phases: ReadonlyArray<string> },
  plan: Rules.ProgressPlan,
  read: ReadonlyArray<number> | null
) => {
  const now = sql`${auth.now}::bigint`
  const fresh = plan.fresh
  return sql<Row>`${sql.literal(Prepared.marker)}
    WITH a AS (
      SELECT reservation_id FROM assignments
      WHERE reservation_id = ${auth.reservationId}::bigint AND device_id = ${auth.deviceId}::bigint AND fence = ${auth.fence}::bigint
        AND state = 'active' AND expires_at > ${now}
        AND last_seq = ${gate.priorSeq}::bigint AND COALESCE(last_phase, '') = ANY(${gate.phases}::text[])
      FOR UPDATE
    ), ins AS (
      INSERT INTO progress_events (reservation_id, seq, kind, phase, at, detail, accepted_at)
      SELECT a.reservation_id, e.seq, e.kind, e.phase, e.at, e.detail, ${now}
      FROM a, unnest(${fresh.map((e) => e.seq)}::int[], ${fresh.map((e) => e.kind)}::text[], ${fresh.map((e) => e.phase)}::text[],
        ${fresh.map((e) => e.at)}::bigint[], ${fresh.map((e) => e.detail ?? null)}::text[]) AS e(seq, kind, phase, at, detail)
    ), u AS (
      UPDATE assignments SET last_phase = ${plan.assignment.lastPhase}::text, last_seq = ${plan.assignment.lastSeq}::int, last_progress_at = ${now}
      FROM a WHERE assignments.reservation_id = a.reservation_id
      RETURNING assignments.*
    )
    SELECT u.*, true AS applied, NULL::json AS stored_events FROM u${
      read === null
        ? sql.literal("")
        : sql`
    UNION ALL
    SELECT s.*, false, ${storedOf(sql, read)} FROM assignments s
    WHERE s.reservation_id = ${auth.reservationId}::bigint AND NOT EXISTS (SELECT 1 FROM u)`
    }`
}

const exactGate = (a: Assignment.Assignment) => ({ priorSeq: a.lastSeq, phases: [a.lastPhase ?? ""] })

/**
 * PostgreSQL, without a transaction: one statement writes a batch whose first event
 * is new, gated under the reservation's row lock on the state the plan assumed; when
 * the gate fails the same statement returns the reservation and the stored events
 * of the batch (one snapshot), the batch is planned on them, and a second gated
 * statement writes it. Events are only ever stored together with a bump of the
 * reservation's last sequence, so an unchanged last sequence (with the reservation
 * still active and unexpired) means the plan still holds. Null when a concurrent
 * batch moved the reservation in between: `pgLocked` decides.
 */
export const pg = (sql: SqlClient.SqlClient, auth: Auth, batch: ReadonlyArray<PhaseModel.Event>): Effect.Effect<Outcome | null, Refusal | SqlError.SqlError> => {
  if (![auth.reservationId, auth.deviceId, auth.fence, auth.now].every(isId)) return Effect.succeed(null)
  const spec = speculate(auth.reservationId, batch, auth.now)
  const seqs = readSeqs(batch)
  const first = spec
    ? pgWrite(sql, auth, spec, spec.plan, seqs)
    : sql<Row>`${sql.literal(Prepared.marker)}SELECT s.*, false AS applied, ${storedOf(sql, seqs)} AS stored_events FROM assignments s WHERE s.reservation_id = ${auth.reservationId}::bigint`
  return Effect.flatMap(first, (rows): Effect.Effect<Outcome | null, Refusal | SqlError.SqlError> => {
    if (spec && rows[0]?.applied === true) return Effect.succeed({ results: spec.plan.results, assignment: Codec.assignment(rows[0]) })
    const planned = planRead(auth, batch, rows[0])
    if (Either.isLeft(planned)) return Effect.fail(planned.left)
    const { a, plan } = planned.right
    if (plan.fresh.length === 0) return Effect.succeed({ results: plan.results, assignment: a })
    return Effect.map(pgWrite(sql, auth, exactGate(a), plan, null), (again) =>
      again[0]?.applied === true ? { results: plan.results, assignment: Codec.assignment(again[0]) } : null
    )
  })
}

/**
 * PostgreSQL, inside the caller's transaction: the reservation read under its row
 * lock, which serialises concurrent batches of one reservation, then its stored
 * events of the batch (a statement of its own: a locking read returns the newest
 * row, but its other reads keep the snapshot taken before the wait), then the
 * gated write, which holds under the lock.
 */
export const pgLocked = (sql: SqlClient.SqlClient, auth: Auth, batch: ReadonlyArray<PhaseModel.Event>): Effect.Effect<Outcome, Refusal | SqlError.SqlError> =>
  Effect.gen(function* () {
    const rows = isId(auth.reservationId) ? yield* sql<Row>`SELECT * FROM assignments WHERE reservation_id = ${auth.reservationId}::bigint FOR UPDATE` : []
    const stored = rows.length === 0 ? [] : yield* sql<Row>`SELECT ${storedOf(sql, readSeqs(batch))} AS stored_events FROM assignments s WHERE s.reservation_id = ${auth.reservationId}::bigint`
    const planned = planRead(auth, batch, rows[0] && { ...rows[0], stored_events: stored[0]?.stored_events })
    if (Either.isLeft(planned)) return yield* Effect.fail(planned.left)
    const { a, plan } = planned.right
    if (plan.fresh.length === 0) return { results: plan.results, assignment: a }
    const [row] = yield* pgWrite(sql, auth, exactGate(a), plan, null)
    if (row?.applied !== true) return yield* Effect.dieMessage(`reservation ${a.reservationId} changed under its row lock`)
    return { results: plan.results, assignment: Codec.assignment(row) }
  })

/**
 * SQLite, inside the caller's write transaction: a batch whose first event is new
 * is written by a gated update of the reservation (which also takes the write lock)
 * and one insert of all its events from a JSON document; otherwise, or when the gate
 * fails, one read of the reservation with its stored events, the plan, then the
 * insert and the update.
 */
export const sqlite = (
  sql: SqlClient.SqlClient,
  auth: Auth,
  batch: ReadonlyArray<PhaseModel.Event>,
  writeLock: Effect.Effect<unknown, SqlError.SqlError>
): Effect.Effect<Outcome, Refusal | SqlError.SqlError> =>
  Effect.gen(function* () {
    const insert = (reservationId: number, fresh: Rules.ProgressPlan["fresh"]) =>
      sql`INSERT INTO progress_events (reservation_id, seq, kind, phase, at, detail, accepted_at)
        SELECT ${reservationId}, j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4, ${auth.now}
        FROM jsonb_each(${JSON.stringify(fresh.map((e) => [e.seq, e.kind, e.phase, e.at, e.detail ?? null]))}) AS j ORDER BY j.key`
    const spec = [auth.reservationId, auth.deviceId, auth.fence, auth.now].every(isId) ? speculate(auth.reservationId, batch, auth.now) : null
    if (spec) {
      const [row] = yield* sql<Row>`
        UPDATE assignments SET last_phase = ${spec.plan.assignment.lastPhase}, last_seq = ${spec.plan.assignment.lastSeq}, last_progress_at = ${auth.now}
        WHERE reservation_id = ${auth.reservationId} AND device_id = ${auth.deviceId} AND fence = ${auth.fence}
          AND state = 'active' AND expires_at > ${auth.now}
          AND last_seq = ${spec.priorSeq} AND COALESCE(last_phase, '') IN (SELECT value FROM json_each(${JSON.stringify(spec.phases)}))
        RETURNING *`
      if (row) {
        yield* insert(auth.reservationId, spec.plan.fresh)
        return { results: spec.plan.results, assignment: Codec.assignment(row) }
      }
      // the update took the write lock even though it matched nothing
    } else yield* writeLock
    const rows = yield* sql<Row>`
      SELECT a.*, (
        SELECT json_group_array(json_array(p.seq, p.kind, p.phase, p.at, p.detail, p.accepted_at)) FROM progress_events p
        WHERE p.reservation_id = a.reservation_id AND p.seq IN (SELECT value FROM json_each(${JSON.stringify(readSeqs(batch))}))
      ) AS stored_events
      FROM assignments a WHERE a.reservation_id = ${isId(auth.reservationId) ? auth.reservationId : null}`
    const planned = planRead(auth, batch, rows[0])
    if (Either.isLeft(planned)) return yield* Effect.fail(planned.left)
    const { a, plan } = planned.right
    if (plan.fresh.length > 0) {
      yield* insert(a.reservationId, plan.fresh)
      yield* sql`UPDATE assignments SET last_phase = ${plan.assignment.lastPhase}, last_seq = ${plan.assignment.lastSeq},
        last_progress_at = ${plan.assignment.lastProgressAt} WHERE reservation_id = ${a.reservationId}`
    }
    return { results: plan.results, assignment: plan.assignment }
  })
