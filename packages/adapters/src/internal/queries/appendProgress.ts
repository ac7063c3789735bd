import type { SqlClient, SqlError } from "@effect/sql"
import { Effect, Either } from "effect"
import { type Assignment, type Errors, PhaseModel, type Store, WorkerWrite } from "@scanfleet/core"
import * as Codec from "../Codec.js"
import * as Prepared from "../Prepared.js"

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
  readonly plan: WorkerWrite.ProgressPlan
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
  const plan = WorkerWrite.planProgress(assumed, [], batch, now)
  return Either.isRight(plan) ? { priorSeq, phases: phases.map((p) => p ?? ""), plan: plan.right } : null
}

type StoredEvent = WorkerWrite.ProgressPlan["fresh"][number]

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
  Either.flatMap(WorkerWrite.authorize(auth, row && Codec.assignment(row)), (a) =>
    Either.map(WorkerWrite.planProgress(a, decodeStored(row?.stored_events), batch, auth.now), (plan) => ({ a, plan }))
  )

const readSeqs = (batch: ReadonlyArray<PhaseModel.Event>) => [...new Set(batch.map((e) => e.seq))].filter(isId)

const storedOf = (sql: SqlClient.SqlClient, seqs: ReadonlyArray<number>) =>
  sql`(
    SELECT COALESCE(json_agg(json_build_array(p.seq, p.kind, p.phase, p.at, p.detail, p.accepted_at)), '[]'::json)
    FROM progress_events p WHERE p.reservation_id = s.reservation_id AND p.seq = ANY(${seqs}::bigint[])
  )`

/**
 * Where a write may find the reservation's timeline: ending at `lo` in one of `phases`
 * ("" for none yet), or at a later sequence up to `hi` whose events are the batch's own
 * (checked event by event against the stored ones), in the phase of the batch's event
 * there. Events of the batch up to the stored end are duplicates, the rest are new.
 */
interface Gate {
  readonly lo: number
  readonly hi: number
  readonly phases: ReadonlyArray<string>
}

// Writes the batch's new events and the reservation's new state, gated under the
// reservation's row lock on a state its plan holds for; the row comes back with
// `applied`, where its timeline ended before (`prior_seq`) and the original acceptance
// of each duplicate. With `read`, a reservation that failed the gate comes back as read
// in the statement's snapshot, with its stored events of those sequences. Duplicates
// are compared in that snapshot: it may miss events stored meanwhile, never hold
// others, so a stale snapshot fails the gate.
const pgWrite = (
  sql: SqlClient.SqlClient,
  auth: Auth,
  gate: Gate,
  events: ReadonlyArray<PhaseModel.Event>,
  last: { readonly phase: string; readonly seq: number },
  read: ReadonlyArray<number> | null
) => {
  const now = sql`${auth.now}::bigint`
  return sql<Row>`${sql.literal(Prepared.marker)}
    WITH b AS (
      SELECT * FROM unnest(${events.map((e) => e.seq)}::int[], ${events.map((e) => e.kind)}::text[], ${events.map((e) => e.phase)}::text[],
        ${events.map((e) => e.at)}::bigint[], ${events.map((e) => e.detail ?? null)}::text[]) WITH ORDINALITY AS e(seq, kind, phase, at, detail, ord)
    ), a AS (
      SELECT reservation_id, last_seq FROM assignments
      -- IS NOT DISTINCT FROM for device and state (both NOT NULL): the row is found by its primary
      -- key, never through a partial index over the device's or the fleet's active reservations
      WHERE reservation_id = ${auth.reservationId}::bigint AND device_id IS NOT DISTINCT FROM ${auth.deviceId}::bigint AND fence = ${auth.fence}::bigint
        AND state IS NOT DISTINCT FROM 'active' AND expires_at > ${now}
        AND last_seq BETWEEN ${gate.lo}::int AND ${gate.hi}::int
        AND CASE WHEN last_seq = ${gate.lo}::int THEN COALESCE(last_phase, '') = ANY(${gate.phases}::text[])
          ELSE last_phase = (SELECT b.phase FROM b WHERE b.seq = last_seq) END
      FOR UPDATE
    ), ok AS (
      SELECT a.* FROM a WHERE NOT EXISTS (
        SELECT 1 FROM b LEFT JOIN progress_events p ON p.reservation_id = a.reservation_id AND p.seq = b.seq
        WHERE b.seq <= a.last_seq
          AND (p.seq IS NULL OR p.kind <> b.kind OR p.phase <> b.phase OR p.at <> b.at OR p.detail IS DISTINCT FROM b.detail))
    ), ins AS (
      INSERT INTO progress_events (reservation_id, seq, kind, phase, at, detail, accepted_at)
      SELECT ok.reservation_id, b.seq, b.kind, b.phase, b.at, b.detail, ${now} FROM ok, b WHERE b.seq > ok.last_seq ORDER BY b.ord
    ), u AS (
      UPDATE assignments SET last_phase = ${last.phase}::text, last_seq = ${last.seq}::int, last_progress_at = ${now}
      FROM ok WHERE assignments.reservation_id = ok.reservation_id
      RETURNING assignments.*, ${sql.literal(Codec.policyOf("assignments"))}
    )
    SELECT u.*, true AS applied, NULL::json AS stored_events, ok.last_seq AS prior_seq, (
      SELECT COALESCE(json_agg(json_build_array(p.seq, p.accepted_at)), '[]'::json) FROM progress_events p
      WHERE p.reservation_id = ok.reservation_id AND p.seq IN (SELECT b.seq FROM b WHERE b.seq <= ok.last_seq)
    ) AS duplicates
    FROM u, ok${
      read === null
        ? sql.literal("")
        : sql`
    UNION ALL
    SELECT s.*, ${sql.literal(Codec.policyOf("s"))}, false, ${storedOf(sql, read)}, NULL::int, NULL::json FROM assignments s
    WHERE s.reservation_id = ${auth.reservationId}::bigint AND NOT EXISTS (SELECT 1 FROM u)`
    }`
}

/** The answer of an applied write: duplicates up to where the timeline ended, the rest accepted now. */
const answered = (batch: ReadonlyArray<PhaseModel.Event>, row: Row, now: number): Outcome => {
  const prior = Number(row.prior_seq)
  const acks = new Map((Codec.json<ReadonlyArray<readonly [unknown, unknown]> | null>(row.duplicates ?? "[]") ?? []).map(([seq, at]) => [Number(seq), Number(at)]))
  return {
    results: batch.map((e): Store.Acceptance =>
      e.seq <= prior ? { seq: e.seq, status: "duplicate", acceptedAt: acks.get(e.seq)! } : { seq: e.seq, status: "accepted", acceptedAt: now }
    ),
    assignment: Codec.assignment(row)
  }
}

/**
 * The gate under which a batch of consecutive sequences needs no read: its events
 * chain legally one to the next, so wherever the stored timeline ends inside the
 * batch (its events there being the batch's own) the rest appends; at the batch's
 * start, the first event must append to the stored phase. Null when no stored state
 * takes the batch without a refusal or a conflict.
 */
export const gateFor = (batch: ReadonlyArray<PhaseModel.Event>): Gate | null => {
  if (batch.length === 0 || !batch.every((e, i) => isId(e.seq) && e.seq === batch[0].seq + i)) return null
  for (let i = 1; i < batch.length; i++)
    if (Either.isLeft(PhaseModel.append({ events: [], phase: batch[i - 1].phase, lastSeq: batch[i - 1].seq }, batch[i]))) return null
  const lo = batch[0].seq - 1
  if (lo < 0) return null
  const phases = priors.filter((p) => Either.isRight(PhaseModel.append({ events: [], phase: p, lastSeq: lo }, batch[0]))).map((p) => p ?? "")
  return { lo, hi: batch[batch.length - 1].seq - 1, phases }
}

const exactGate = (a: Assignment.Assignment): Gate => ({ lo: a.lastSeq, hi: a.lastSeq, phases: [a.lastPhase ?? ""] })

const lastOf = (plan: WorkerWrite.ProgressPlan) => ({ phase: plan.assignment.lastPhase ?? "", seq: plan.assignment.lastSeq })

/**
 * PostgreSQL, without a transaction: one statement writes a batch of consecutive
 * sequences that chain legally, gated under the reservation's row lock on a stored
 * state its plan holds for (see `gateFor`): it starts where the timeline ends, or
 * resends a part of it first. When the gate fails the same statement returns the
 * reservation and the stored events of the batch (one snapshot), the batch is planned
 * on them, and a second gated statement writes it. Events are only ever stored
 * together with a bump of the reservation's last sequence, so an unchanged last
 * sequence (with the reservation still active and unexpired) means the plan still
 * holds. Null when a concurrent batch moved the reservation in between: `pgLocked`
 * decides.
 */
export const pg = (sql: SqlClient.SqlClient, auth: Auth, batch: ReadonlyArray<PhaseModel.Event>): Effect.Effect<Outcome | null, Refusal | SqlError.SqlError> => {
  if (![auth.reservationId, auth.deviceId, auth.fence, auth.now].every(isId)) return Effect.succeed(null)
  const gate = gateFor(batch)
  const seqs = readSeqs(batch)
  const end = batch[batch.length - 1]
  const first = gate
    ? pgWrite(sql, auth, gate, batch, { phase: end.phase, seq: end.seq }, seqs)
    : sql<Row>`${sql.literal(Prepared.marker)}SELECT s.*, ${sql.literal(Codec.policyOf("s"))}, false AS applied, ${storedOf(sql, seqs)} AS stored_events FROM assignments s WHERE s.reservation_id = ${auth.reservationId}::bigint`
  return Effect.flatMap(first, (rows): Effect.Effect<Outcome | null, Refusal | SqlError.SqlError> => {
    if (gate && rows[0]?.applied === true) return Effect.succeed(answered(batch, rows[0], auth.now))
    const planned = planRead(auth, batch, rows[0])
    if (Either.isLeft(planned)) return Effect.fail(planned.left)
    const { a, plan } = planned.right
    if (plan.fresh.length === 0) return Effect.succeed({ results: plan.results, assignment: a })
    return Effect.map(pgWrite(sql, auth, exactGate(a), plan.fresh, lastOf(plan), null), (again) =>
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
    const rows = isId(auth.reservationId) ? yield* sql<Row>`SELECT ${sql.literal(Codec.assignmentColumns)} FROM assignments WHERE reservation_id = ${auth.reservationId}::bigint FOR UPDATE` : []
    const stored = rows.length === 0 ? [] : yield* sql<Row>`SELECT ${storedOf(sql, readSeqs(batch))} AS stored_events FROM assignments s WHERE s.reservation_id = ${auth.reservationId}::bigint`
    const planned = planRead(auth, batch, rows[0] && { ...rows[0], stored_events: stored[0]?.stored_events })
    if (Either.isLeft(planned)) return yield* Effect.fail(planned.left)
    const { a, plan } = planned.right
    if (plan.fresh.length === 0) return { results: plan.results, assignment: a }
    const [row] = yield* pgWrite(sql, auth, exactGate(a), plan.fresh, lastOf(plan), null)
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
    const insert = (reservationId: number, fresh: WorkerWrite.ProgressPlan["fresh"]) =>
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
        RETURNING ${sql.literal(Codec.assignmentColumns)}`
      if (row) {
        yield* insert(auth.reservationId, spec.plan.fresh)
        return { results: spec.plan.results, assignment: Codec.assignment(row) }
      }
      // the update took the write lock even though it matched nothing
    } else yield* writeLock
    const rows = yield* sql<Row>`
      SELECT a.*, ${sql.literal(Codec.policyOf("a"))}, (
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
