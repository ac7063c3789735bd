import { SqlClient, Statement } from "@effect/sql"
import { Effect, Either, Exit, Ref, Schedule } from "effect"
import { Assignment, Claim, Deadline, Errors, Findings, Percentile, Priority, Source, Store, type Target, WorkerWrite } from "@scanfleet/core"
import * as SqlFindingStore from "../SqlFindingStore.js"
import * as Codec from "./Codec.js"
import * as Rollups from "./Rollups.js"
import * as Prepared from "./Prepared.js"
import * as Coalesce from "./Coalesce.js"
import * as Dialect from "./Dialect.js"
import * as Policies from "./Policies.js"
import { mapped } from "./SqlErrors.js"
import { claimBatch, claimNext } from "./queries/claimNext.js"
import * as Progress from "./queries/appendProgress.js"
import * as Promote from "./queries/promote.js"
import * as SubmitResults from "./queries/submitResults.js"
import * as Record from "./queries/recordObservations.js"
import * as Submit from "./queries/submitResult.js"

type Row = { readonly [column: string]: unknown }

// Ids are integers in every table; anything else can only miss, as in core's model.
const isId = (n: number) => Number.isSafeInteger(n)
const byText = (a: string, b: string) => a.localeCompare(b)

/**
 * The Store port over an `@effect/sql` client. Postgres and SQLite share the
 * statements; what differs in them (row locks, JSON parameters, the write lock) is the
 * client's `Dialect`, and the operations whose statements differ as a whole (batch
 * shapes: `unnest` against `json_each`) are chosen by dialect once, here. Each operation is
 * one statement or one transaction, with at most one fallback (a transaction that names the
 * exact reason of what the statement did not take), and every SqlError leaves as a StoreError.
 */
export const make: Effect.Effect<Store.StoreShape, never, SqlClient.SqlClient> = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const dialect = Dialect.of(sql)
  const isPg = dialect.name === "pg"
  // A claim's configuration's policies, interned before the claim (see Policies.make).
  const policies = Policies.make(sql, isPg)
  const { forUpdate, writeLock, inIds } = dialect

  // A deadlock or serialization failure aborted the whole statement or transaction
  // before anything was committed: it is safe to run again.
  const retryConflicts = <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
    Effect.retry(self, {
      while: (e: E) => e instanceof Errors.StoreError && e.reason === "conflict",
      schedule: Schedule.intersect(Schedule.exponential("5 millis"), Schedule.recurs(4))
    })
  const transaction = <A, E, R>(self: Effect.Effect<A, E, R>) =>
    retryConflicts(mapped(sql.withTransaction(Effect.zipRight(writeLock, self))))
  const fleetRead = yield* Ref.make<Store.Fleet | null>(null)
  const readFleet = mapped(Effect.map(sql<Row>`SELECT id, created_at FROM fleet`, ([r]): Store.Fleet => ({ id: String(r.id), createdAt: Number(r.created_at) })))

  const loadAssignment = (reservationId: number, lock: boolean) =>
    isId(reservationId)
      ? Effect.map(
          Effect.zipRight(
            lock ? dialect.reservationWriter : Effect.void,
            sql<Row>`SELECT ${sql.literal(Codec.assignmentColumns)} FROM assignments WHERE reservation_id = ${reservationId}${lock ? forUpdate : sql.literal("")}`
          ),
          (rows) => (rows.length === 0 ? undefined : Codec.assignment(rows[0]))
        )
      : Effect.succeed(undefined)

  const loadTarget = (id: number) =>
    Effect.map(sql<Row>`SELECT ${sql.literal(Codec.targetColumns)} FROM targets WHERE id = ${id}${forUpdate}`, (rows) => Codec.target(rows[0]))

  // Postgres: the counts that result acceptance left in duration_rollup_deltas move into
  // the rollups, in one statement, before a percentile query reads them. The DELETE takes
  // each delta once even when two readers fold at the same time; keys in one order.
  const rollupSlots = Array.from({ length: Rollups.width }, (_, i) => `c${i}`)
  const foldDeltas = isPg
    ? sql`
        WITH moved AS (DELETE FROM duration_rollup_deltas RETURNING *)
        INSERT INTO duration_rollups AS r (span, source, metric, outcome, start, chunk, ${sql.literal(rollupSlots.join(", "))})
        SELECT span, source, metric, outcome, start, chunk, ${sql.literal(rollupSlots.map((c) => `sum(${c})`).join(", "))}
        FROM moved GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1, 2, 3, 4, 5, 6
        ON CONFLICT (span, source, metric, outcome, start, chunk) DO UPDATE SET ${sql.literal(rollupSlots.map((c) => `${c} = r.${c} + excluded.${c}`).join(", "))}`
    : Effect.void

  // Postgres: the reservations whose results were accepted wait in duration_pending; a fold
  // takes a batch of them (by row address, in one transaction), reads each one's ended row
  // and timeline, and stores the durations core's WorkerWrite.durationsOfEnded gives, with
  // their rollups at once. `skipLocked` (the sweep) leaves rows another fold holds; without
  // it (a percentile read) the delete waits for that fold to commit, so the read after it
  // counts every result accepted before it began. Returns how many reservations it folded.
  const foldBatch = 2000
  const foldPending = (limit: number, skipLocked: boolean): Effect.Effect<number, Errors.StoreError> =>
    retryConflicts(
      mapped(
        sql.withTransaction(
          Effect.gen(function* () {
            const rows = yield* sql<Row>`
              WITH taken AS (
                DELETE FROM duration_pending WHERE ctid = ANY (ARRAY(
                  SELECT ctid FROM duration_pending LIMIT ${limit}${sql.literal(skipLocked ? " FOR UPDATE SKIP LOCKED" : "")}))
                RETURNING reservation_id
              )
              SELECT a.reservation_id, a.source, a.issued_at, a.outcome, a.ended_at, (
                SELECT COALESCE(json_agg(json_build_array(p.seq, p.kind, p.phase, p.at, p.detail, p.accepted_at) ORDER BY p.seq), '[]'::json)
                FROM progress_events p WHERE p.reservation_id = a.reservation_id
              ) AS timeline
              FROM assignments a WHERE a.reservation_id IN (SELECT reservation_id FROM taken) AND a.outcome IS NOT NULL
              ORDER BY a.reservation_id`
            if (rows.length === 0) return 0
            const ds = rows.flatMap((r) =>
              WorkerWrite.durationsOfEnded(
                { source: r.source as Source.Source, issuedAt: Number(r.issued_at) },
                Submit.decodeTimeline(r.timeline),
                r.outcome as Assignment.Outcome,
                Number(r.ended_at)
              )
            )
            yield* sql`SELECT set_config('scanfleet.rollups_direct', 'on', true)`
            yield* insertDurations(ds)
            return rows.length
          })
        )
      )
    )
  // SQLite (since its 0011): the same fold under the write lock, a batch in id order, taken
  // out of the pending list in the transaction that stores its durations.
  const foldPendingSqlite = (limit: number): Effect.Effect<number, Errors.StoreError> =>
    transaction(
      Effect.gen(function* () {
        const rows = yield* sql<Row>`
          SELECT d.reservation_id, a.source, a.issued_at, a.outcome, a.ended_at, (
            SELECT json_group_array(json_array(p.seq, p.kind, p.phase, p.at, p.detail, p.accepted_at) ORDER BY p.seq)
            FROM progress_events p WHERE p.reservation_id = d.reservation_id
          ) AS timeline
          FROM duration_pending d LEFT JOIN assignments a ON a.reservation_id = d.reservation_id
          ORDER BY d.reservation_id LIMIT ${limit}`
        if (rows.length === 0) return 0
        const ds = rows.flatMap((r) =>
          r.outcome === null || r.outcome === undefined
            ? []
            : WorkerWrite.durationsOfEnded(
                { source: r.source as Source.Source, issuedAt: Number(r.issued_at) },
                Submit.decodeTimeline(r.timeline),
                r.outcome as Assignment.Outcome,
                Number(r.ended_at)
              )
        )
        yield* insertDurations(ds)
        yield* sql`DELETE FROM duration_pending WHERE reservation_id <= ${Number(rows[rows.length - 1].reservation_id)}`
        return rows.length
      })
    )
  // Postgres: the claim's scan starts at claim_head (migration 0013); the sweep raises it to the
  // lowest pending claim key, over the index entries claimed targets left at the head of
  // targets_claim_idx, unless a write that made a target pending bumped the epoch since it read.
  const raiseClaimHead = sql`SELECT scanfleet_raise_claim_head()`
  const foldSome = (limit: number, skipLocked: boolean) => (isPg ? foldPending(limit, skipLocked) : foldPendingSqlite(limit))
  // Everything pending now, a batch at a time; a batch short of the limit was the last one.
  const foldAllPending: Effect.Effect<void, Errors.StoreError> = Effect.flatMap(foldSome(foldBatch, false), (n) => (n < foldBatch ? Effect.void : foldAllPending))

  // Only well-formed credentials reach the one-statement paths; anything else can only be refused.
  const acceptable = (i: Store.ResultInput) => [i.reservationId, i.deviceId, i.fence, i.now].every(isId)

  // Postgres: single results merged into one acceptMany while batches are in flight (bounded
  // batch; two results of one reservation never share a batch). Two batches may run at once, so
  // the next one forms and runs while the previous waits for its commit (fsync). Null: not
  // accepted by the statement.
  const acceptOne = Coalesce.make<Store.ResultInput, Assignment.Receipt | null, Errors.StoreError>({
    max: 64,
    inFlight: 2,
    fits: (i, batch) => batch.every((b) => b.reservationId !== i.reservationId),
    run: (batch) =>
      retryConflicts(mapped(SubmitResults.acceptMany(sql, batch))).pipe(
        Effect.catchIf((e) => e.reason === "constraint", () => Effect.succeed(new Map<number, Assignment.Receipt>())),
        Effect.map((accepted) => batch.map((i) => Exit.succeed(accepted.get(i.reservationId) ?? null)))
      )
  })

  // Postgres: a result judged in a transaction, the reservation then its target under their row
  // locks; core decides; the writes are the one-statement path's, for one result.
  const submitJudged = (input: Store.ResultInput) =>
    transaction(
      Effect.gen(function* () {
        const a = yield* loadAssignment(input.reservationId, true)
        const t = a === undefined ? undefined : yield* loadTarget(a.targetId)
        const judged = WorkerWrite.judgeResult(input, a, () => t!)
        if (Either.isLeft(judged)) return yield* Effect.fail(judged.left)
        if (judged.right._tag === "repeat") return judged.right.receipt
        const accepted = yield* SubmitResults.acceptMany(sql, [input], true)
        const receipt = accepted.get(input.reservationId)
        // the reservation and its target are locked and were judged acceptable just now
        if (receipt === undefined) return yield* Effect.dieMessage(`reservation ${input.reservationId} changed under its row lock`)
        // Findings: related to the target's stored ones and written in this transaction, with the result.
        yield* SqlFindingStore.record(sql, SqlFindingStore.scanOf(input, a!))
        return receipt
      })
    )

  // Postgres, without a fleet-wide cap: single claims merged into one statement while batches are
  // in flight (two at most, as for results), when they share configuration and sources (bounded
  // batch; one (device, slot) once).
  const claimOne = Coalesce.make<Store.ClaimRequest, Assignment.Assignment | null, Errors.StoreError>({
    max: 64,
    inFlight: 2,
    fits: (r, batch) => batch.length === 0 || (sameConfig(batch[0].config, r.config) && sameSources(batch[0].sources, r.sources) && batch.every((b) => b.deviceId !== r.deviceId || b.slot !== r.slot)),
    run: (batch) =>
      Effect.map(claimFast(batch.map((r) => ({ deviceId: r.deviceId, slot: r.slot, now: r.now })), batch[0], false), (taken) =>
        batch.map((_, i) => Exit.succeed(taken?.get(i) ?? null))
      )
  })

  // Postgres, without a fleet-wide cap or a client deadline: results, each followed by the claim
  // of its device's next slot, merged into one statement while batches are in flight (as
  // single claims and results are; one reservation once, one (device, slot) once). Null: the
  // statement did not accept the result (a refusal, a repeat, a race, open findings), or the
  // schema refused the whole statement; `slotOk`: the claim passed its checks, so a missing
  // `next` means nothing was pending.
  type Paired = { readonly input: Store.ResultInput; readonly next: Store.NextClaim }
  type PairedAnswer = { readonly receipt: Assignment.Receipt; readonly next: Assignment.Assignment | null; readonly slotOk: boolean }
  const acceptClaimOne = Coalesce.make<Paired, PairedAnswer | null, Errors.StoreError>({
    max: 64,
    inFlight: 2,
    fits: (x, batch) =>
      batch.length === 0 ||
      (sameConfig(batch[0].next.config, x.next.config) &&
        sameSources(batch[0].next.sources, x.next.sources) &&
        batch.every((b) => b.input.reservationId !== x.input.reservationId && (b.input.deviceId !== x.input.deviceId || b.next.slot !== x.next.slot))),
    run: (batch) =>
      Effect.flatMap(policies(batch[0].next.config), (interned) => retryConflicts(mapped(resultAndClaimStatement(batch, interned)))).pipe(
        Effect.catchIf((e) => e.reason === "constraint", () => Effect.succeed(new Map<number, PairedAnswer>())),
        Effect.map((answers) => batch.map((_, i) => Exit.succeed(answers.get(i) ?? null)))
      )
  })

  // The statement of acceptClaimOne: acceptMany's steps, then the claim statement's steps over the
  // devices and slots of the results it accepted, each reservation it ended freeing its slot.
  function resultAndClaimStatement(batch: ReadonlyArray<Paired>, interned: Policies.Interned) {
    const inputs = batch.map((b) => b.input)
    const reqs = batch.map((b) => ({ deviceId: b.input.deviceId, slot: b.next.slot, now: b.input.now }))
    const { ctes, receipts } = SubmitResults.steps(sql, inputs, false)
    return Effect.map(
      sql<Row>`${sql.literal(Prepared.marker)}
        WITH ${ctes}, nx AS (
          SELECT * FROM unnest(${inputs.map((i) => i.reservationId)}::bigint[], ${reqs.map((r) => r.slot)}::int[], ${reqs.map((r) => r.now)}::bigint[])
            WITH ORDINALITY AS n(reservation_id, slot, now, ord)
        ), req AS (
          SELECT u.device_id, nx.slot, nx.now, nx.ord, u.reservation_id AS freed FROM u JOIN nx ON nx.reservation_id = u.reservation_id
        ), ${claimSteps(batch[0].next, interned, false)}
        SELECT u.reservation_id AS done_id, EXISTS (SELECT 1 FROM g WHERE g.freed = u.reservation_id) AS slot_ok, c.*
        FROM u LEFT JOIN (SELECT ct.*, ins.reservation_id AS fast_reservation_id FROM ct JOIN ins ON ins.target_id = ct.id) c ON c.r_freed = u.reservation_id`,
      (rows) => {
        const at = new Map(inputs.map((i, k) => [i.reservationId, k]))
        const out = new Map<number, PairedAnswer>()
        for (const r of rows) {
          const id = Number(r.done_id)
          const next = r.fast_reservation_id === null || r.fast_reservation_id === undefined ? null : claimedRow(r, reqs, batch[0].next)
          out.set(at.get(id)!, { receipt: receipts.get(id)!, next, slotOk: r.slot_ok === true })
        }
        return out
      }
    )
  }

  const store: Store.StoreShape = {
    recordObservations: (batch, now) =>
      retryConflicts(isPg ? mapped(Record.pg(sql, batch, now)) : transaction(Record.sqlite(sql, batch, now))),

    promote: (source, rule, now) =>
      Source.hasRemoteTimestamp(source)
        ? retryConflicts(isPg ? mapped(Promote.pg(sql, source, rule, now)) : transaction(Promote.sqlite(sql, source, rule, now)))
        : Effect.succeed({ promoted: [], deferred: 0 }),

    claim: (req) =>
      Effect.flatMap(isPg && req.sourceCap === undefined && fastClaimable(req, [req.slot]) ? claimOne(req) : Effect.succeed(null), (fast) =>
        fast !== null ? Effect.succeed(fast) : Effect.map(claimSlots({ ...req, slots: [req.slot] }), (as) => as[0] ?? null)
      ),

    // One device's slots: the same statement as merged single claims, all or nothing.
    claimMany: (req) =>
      Effect.flatMap(
        isPg && req.sourceCap === undefined && fastClaimable(req, req.slots) && new Set(req.slots).size === req.slots.length
          ? Effect.map(claimFast(req.slots.map((slot) => ({ deviceId: req.deviceId, slot, now: req.now })), req, true), (taken) =>
              taken === null || taken.size === 0 ? null : req.slots.flatMap((_, i) => (taken.has(i) ? [taken.get(i)!] : []))
            )
          : Effect.succeed(null),
        (fast) => (fast !== null ? Effect.succeed(fast) : claimSlots(req))
      ),

    appendProgress: (auth, batch) =>
      isPg
        ? // One statement for a batch that starts where the timeline ends, two when it must be read
          // first; the transaction below only when a concurrent batch moved the reservation in between.
          Effect.flatMap(
            retryConflicts(
              mapped(Progress.pg(sql, auth, batch)).pipe(
                // a duplicate key can only mean a batch raced this one: the transaction decides
                Effect.catchIf((e) => e instanceof Errors.StoreError && e.reason === "constraint", () => Effect.succeed(null))
              )
            ),
            (fast) => (fast !== null ? Effect.succeed(fast) : transaction(Progress.pgLocked(sql, auth, batch)))
          )
        : retryConflicts(mapped(sql.withTransaction(Progress.sqlite(sql, auth, batch, writeLock)))),

    // Postgres: concurrent single results merge into one statement (acceptMany) while one is
    // in flight; a result it did not accept (a refusal, a repeat, a race, a target with open
    // findings) and a result that carries findings are judged by the transaction, which names
    // the exact reason and relates the findings.
    submitResult: (input) =>
      !isPg
        ? retryConflicts(mapped(sql.withTransaction(Submit.sqlite(sql, input, insertDurations))))
        : Effect.flatMap(acceptable(input) && !Findings.carriesFindings(input.outcome, input.body) ? acceptOne(input) : Effect.succeed(null), (fast) =>
            fast !== null ? Effect.succeed(fast) : submitJudged(input)
          ),

    submitResults: (inputs) =>
      Effect.gen(function* () {
        // Postgres takes the common accepted results in one statement (each reservation once); the
        // rest (refusals, repeats, races) and every result on SQLite are judged one by one.
        const seen = new Set<number>()
        // Results that carry findings are related by the transaction (acceptMany also declines targets with open findings).
        const batch = isPg ? inputs.filter((i) => acceptable(i) && !Findings.carriesFindings(i.outcome, i.body) && !seen.has(i.reservationId) && seen.add(i.reservationId)) : []
        const accepted =
          batch.length === 0
            ? new Map<number, Assignment.Receipt>()
            : yield* retryConflicts(mapped(SubmitResults.acceptMany(sql, batch))).pipe(
                Effect.catchIf((e) => e.reason === "constraint", () => Effect.succeed(new Map<number, Assignment.Receipt>()))
              )
        const answers: Array<Either.Either<Assignment.Receipt, Errors.ReservationRefused>> = []
        for (const input of inputs) {
          const receipt = accepted.get(input.reservationId)
          if (receipt !== undefined && receipt.acceptedAt === input.now && receipt.receiptId === WorkerWrite.receiptId(input.reservationId, input.fence)) {
            accepted.delete(input.reservationId)
            answers.push(Either.right(receipt))
          } else
            answers.push(
              yield* (isPg ? submitJudged(input) : store.submitResult(input)).pipe(
                Effect.map((r) => Either.right(r)),
                Effect.catchTag("ReservationRefused", (e) => Effect.succeed(Either.left(e)))
              )
            )
        }
        return answers
      }),

    submitResultAndClaim: (input, next) =>
      isPg &&
      acceptable(input) &&
      !Findings.carriesFindings(input.outcome, input.body) &&
      next.sourceCap === undefined &&
      next.notAfter === undefined &&
      fastClaimable({ deviceId: input.deviceId, now: input.now, config: next.config, sources: next.sources }, [next.slot])
        ? Effect.flatMap(acceptClaimOne({ input, next }), (fast) =>
            fast === null
              ? Store.resultThenClaim(store)(input, next)
              : fast.slotOk
                ? Effect.succeed<Store.ResultAndClaim>({ receipt: fast.receipt, next: fast.next, claimRefused: null })
                : // the claim did not pass its checks: the claim on its own names the reason
                  Store.claimAfter(store, input, next, fast.receipt)
          )
        : Store.resultThenClaim(store)(input, next),

    release: (auth) =>
      transaction(
        Effect.gen(function* () {
          const a = yield* loadAssignment(auth.reservationId, true)
          const t = a === undefined ? undefined : yield* loadTarget(a.targetId)
          const judged = WorkerWrite.judgeRelease(auth, a, () => t!)
          if (Either.isLeft(judged)) return yield* Effect.fail(judged.left)
          const released = judged.right
          yield* sql`UPDATE targets SET status = 'pending', fence = fence + 1 WHERE id = ${released.targetId} AND status = 'in_progress' AND fence = ${released.fence}`
          yield* sql`UPDATE assignments SET state = 'released', ended_at = ${auth.now} WHERE reservation_id = ${released.reservationId}`
          return released
        })
      ),

    // The sweep also (Postgres, after its transaction) raises the claim head, then folds a batch of
    // the durations result acceptance left pending, and the percentile deltas: they never pile up
    // between percentile queries while a fleet is running. The head goes first, so a fold slowed by
    // a backlog of durations never holds it back while claims walk the entries left behind it.
    expireDue: (req) =>
      Effect.tap(transaction(
        Effect.gen(function* () {
          const limit = Math.max(0, Math.floor(req.limit))
          if (limit === 0) return []
          yield* dialect.reservationWriter
          // SKIP LOCKED: two sweepers expire disjoint sets; a reservation being completed right now is left alone.
          // On PostgreSQL this reads assignments_active_expiry_idx, whose predicate `expires_at <= now` implies (0015).
          const due = (yield* sql<Row>`
            SELECT ${sql.literal(Codec.assignmentColumns)} FROM assignments WHERE state = 'active' AND expires_at <= ${req.now}
            ORDER BY expires_at, reservation_id LIMIT ${limit}${dialect.skipLocked}`).map(Codec.assignment)
          if (due.length === 0) return []
          const ids = due.map((a) => a.reservationId)
          yield* sql`
            UPDATE targets SET status = CASE WHEN attempts < CAST(${req.maxAttempts} AS DOUBLE PRECISION) THEN 'pending' ELSE 'failed' END, fence = fence + 1
            WHERE status = 'in_progress' AND (id, fence) IN (SELECT target_id, fence FROM assignments WHERE reservation_id ${inIds(ids)})`
          yield* sql`
            UPDATE assignments SET state = 'expired', ended_at = ${req.now}, expired_at = ${req.now},
              expiry_last_phase = last_phase, expiry_last_progress_at = last_progress_at
            WHERE reservation_id ${inIds(ids)}`
          return due.map(
            (a): Assignment.Assignment => ({
              ...a,
              state: "expired",
              endedAt: req.now,
              expiry: { lastPhase: a.lastPhase, lastProgressAt: a.lastProgressAt, expiredAt: req.now }
            })
          )
        })
      ), () =>
        isPg
          ? Effect.all([mapped(raiseClaimHead), foldPending(foldBatch, true), retryConflicts(mapped(foldDeltas))], { discard: true })
          : Effect.asVoid(foldPendingSqlite(foldBatch))),

    getAssignment: (reservationId) =>
      Effect.flatMap(mapped(loadAssignment(reservationId, false)), (a) =>
        a ? Effect.succeed(a) : Effect.fail(new Errors.NotFound({ entity: "assignment", key: String(reservationId) }))
      ),

    listAssignments: (q) => {
      const limit = Math.max(0, Math.floor(q.limit))
      if (limit === 0) return Effect.succeed([])
      const filters = [sql`1 = 1`]
      if (q.state !== undefined) filters.push(sql`state = ${q.state}`)
      if (q.deviceId !== undefined) filters.push(isId(q.deviceId) ? sql`device_id = ${q.deviceId}` : sql`1 = 0`)
      return mapped(
        Effect.map(sql<Row>`SELECT ${sql.literal(Codec.assignmentColumns)} FROM assignments WHERE ${sql.and(filters)} ORDER BY reservation_id DESC LIMIT ${limit}`, (rows) => rows.map(Codec.assignment))
      )
    },

    timeline: (reservationId) =>
      isId(reservationId)
        ? mapped(Effect.map(sql<Row>`SELECT * FROM progress_events WHERE reservation_id = ${reservationId} ORDER BY seq`, (rows) => rows.map(Codec.event)))
        : Effect.succeed([]),

    getTarget: (source, identity) =>
      Effect.flatMap(
        mapped(sql<Row>`SELECT ${sql.literal(Codec.targetColumns)} FROM targets WHERE source = ${source} AND identity = ${identity}`),
        (rows) => (rows.length === 0 ? Effect.fail(new Errors.NotFound({ entity: "target", key: `${source}:${identity}` })) : Effect.succeed(Codec.target(rows[0])))
      ),

    countTargets: () =>
      mapped(
        Effect.map(sql<Row>`SELECT source, status, count(*) AS n FROM targets GROUP BY source, status`, (rows) =>
          rows
            .map((r) => ({ source: r.source as Store.TargetCount["source"], status: r.status as Store.TargetCount["status"], count: Number(r.n) }))
            .sort((a, b) => byText(a.source, b.source) || byText(a.status, b.status))
        )
      ),

    countAssignments: () =>
      mapped(
        Effect.map(sql<Row>`SELECT state, source, outcome, last_phase, count(*) AS n FROM assignments GROUP BY state, source, outcome, last_phase`, (rows) =>
          rows
            .map(
              (r): Store.AssignmentCount => ({
                state: r.state as Store.AssignmentCount["state"],
                source: r.source as Store.AssignmentCount["source"],
                outcome: (r.outcome ?? null) as Store.AssignmentCount["outcome"],
                lastPhase: (r.last_phase ?? null) as Store.AssignmentCount["lastPhase"],
                count: Number(r.n)
              })
            )
            .sort(Store.compareAssignmentCounts)
        )
      ),

    cycleTotals: () =>
      mapped(
        Effect.map(
          sql<Row>`SELECT source, count(*) AS n, sum(queued_new_count) AS new_count, sum(queued_updated_count) AS updated_count FROM cycles GROUP BY source`,
          (rows) =>
            rows
              .map((r): Store.CycleTotal => ({ source: r.source as Store.CycleTotal["source"], cycles: Number(r.n), queuedNewCount: Number(r.new_count), queuedUpdatedCount: Number(r.updated_count) }))
              .sort((a, b) => byText(a.source, b.source))
        )
      ),

    recordCycle: (c) =>
      mapped(
        Effect.map(
          sql<{ id: number }>`
            INSERT INTO cycles (source, started_at, ended_at, pages, results, malformed, queued_new_count, queued_updated_count, deferred_count, stop_reason, error)
            VALUES (${c.source}, ${c.startedAt}, ${c.endedAt}, ${c.pages}, ${c.results}, ${c.malformed}, ${c.queuedNewCount}, ${c.queuedUpdatedCount},
              ${c.deferredCount}, ${c.stopReason}, ${c.error})
            RETURNING id`,
          ([r]) => ({ ...c, id: Number(r.id) })
        )
      ),

    listCycles: (q) => {
      const limit = Math.max(0, Math.floor(q.limit))
      if (limit === 0) return Effect.succeed([])
      return mapped(
        Effect.map(
          q.source === undefined
            ? sql<Row>`SELECT * FROM cycles ORDER BY id DESC LIMIT ${limit}`
            : sql<Row>`SELECT * FROM cycles WHERE source = ${q.source} ORDER BY id DESC LIMIT ${limit}`,
          (rows) => rows.map(Codec.cycle)
        )
      )
    },

    // A bulk write: on Postgres its trigger upserts the rollups at once instead of leaving
    // deltas for a reader to fold (see migration 0005).
    recordDurations: (ds) =>
      Effect.suspend(() => {
        const stored = Percentile.storedDurations(ds)
        if (stored === undefined) return Effect.fail(Percentile.unstorable())
        return isPg && stored.length > 0
          ? retryConflicts(mapped(sql.withTransaction(Effect.zipRight(sql`SELECT set_config('scanfleet.rollups_direct', 'on', true)`, insertDurations(stored)))))
          : mapped(insertDurations(stored))
      }),

    percentiles: (q) => {
      const filters = (time: Statement.Fragment) => {
        const fs = [time]
        if (q.source) fs.push(sql`source = ${q.source}`)
        if (q.metric) fs.push(sql`metric = ${q.metric}`)
        if (q.outcome) fs.push(sql`outcome = ${q.outcome}`)
        return sql.and(fs)
      }
      const slots = Array.from({ length: Rollups.width }, (_, i) => i)
      // Raw rows group by bytes, as the rollups' "C" columns do on Postgres.
      const bytes = dialect.bytes
      // Whole days, six hours, hours and ten minutes come from the rollups, what is left at the two
      // ends from raw rows, each part added or taken away as Rollups.plan chose (a part taken away is
      // read with its counts negated): counts of exactly the window, in log buckets. The raw rows
      // are counted by bucket before they are spread over the 32 columns, so each of the thousands
      // of rows at an edge costs its bucket and one count, not 32 cases and 32 sums. Their counts
      // are integers, as the rollups' columns are, so the union's columns stay integers and
      // PostgreSQL sums them into a bigint; a bigint count would make every column a bigint, summed
      // into a numeric (19,000 rows of 32 columns: 11.4 ms against 18.5). A raw stretch is under
      // ten minutes.
      const window = Percentile.windowOf(q.from, q.to)
      const parts = Rollups.plan(window.from, window.to).map((p) => {
        const neg = p.sign === 1 ? "" : "-"
        return p._tag === "rollup"
          ? sql`SELECT source, metric, outcome, chunk, ${sql.literal(slots.map((i) => `${neg}c${i} AS c${i}`).join(", "))} FROM duration_rollups
              WHERE ${filters(sql`span = ${p.span} AND start >= ${p.from} AND start < ${p.to}`)}`
          : sql`SELECT source${sql.literal(bytes)} AS source, metric${sql.literal(bytes)} AS metric, outcome${sql.literal(bytes)} AS outcome,
              b >> 5 AS chunk, ${sql.literal(slots.map((i) => `CASE WHEN b & 31 = ${i} THEN n ELSE 0 END AS c${i}`).join(", "))}
              FROM (SELECT source, metric, outcome, ${sql.literal(Rollups.bucketSql("ms"))} AS b, ${sql.literal(neg)}CAST(count(*) AS INTEGER) AS n FROM durations
                WHERE ${filters(sql`at >= ${p.from} AND at < ${p.to}`)} GROUP BY 1, 2, 3, 4) AS r`
      })
      if (parts.length === 0) return Effect.succeed([])
      const counts = sql<Row>`
            SELECT source, metric, outcome, chunk, ${sql.literal(slots.map((i) => `CAST(sum(c${i}) AS DOUBLE PRECISION) AS c${i}`).join(", "))}
            FROM (${sql.join(" UNION ALL ", false)(parts)}) AS u
            GROUP BY source, metric, outcome, chunk`
      // On PostgreSQL without parallel workers: the read is a few thousand rollup rows and the raw
      // rows of two edges, and starting workers and merging their sorted groups cost more than they
      // save (one source over seven days with edges mid-hour, 100,000 durations: 55 ms of execution
      // with two workers, 18 ms without; workload 6's slowest query 82 ms with them, 45 ms without).
      // The parts it takes away must find in the rollups exactly the raw rows they subtract, so the
      // deltas an older writer may have left are folded in the read's own snapshot (REPEATABLE READ):
      // a delta committed after it is invisible there with its durations.
      const read: Effect.Effect<ReadonlyArray<Row>, Errors.StoreError> = isPg
        ? retryConflicts(
            mapped(
              sql.withTransaction(
                sql`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`.pipe(
                  Effect.zipRight(sql`SELECT set_config('max_parallel_workers_per_gather', '0', true)`),
                  Effect.zipRight(foldDeltas),
                  Effect.zipRight(counts)
                )
              )
            )
          )
        : mapped(counts)
      return mapped(
        Effect.map(
          Effect.zipRight(foldAllPending, read),
          (rows) => {
            // One histogram per group, merged from its chunks, read by core's rank rule.
            const groups = new Map<string, { key: Row; h: Map<number, number> }>()
            for (const r of rows) {
              const k = `${r.source}/${r.metric}/${r.outcome}`
              const g = groups.get(k) ?? { key: r, h: new Map<number, number>() }
              groups.set(k, g)
              const base = Number(r.chunk) * Rollups.width
              for (const i of slots) {
                const c = Number(r[`c${i}`])
                if (c > 0) g.h.set(base + i, (g.h.get(base + i) ?? 0) + c)
              }
            }
            return [...groups.values()]
              .filter((g) => g.h.size > 0)
              .map(
                (g): Store.PercentileRow => ({
                  source: g.key.source as Store.PercentileRow["source"],
                  metric: g.key.metric as Store.PercentileRow["metric"],
                  outcome: g.key.outcome as Store.PercentileRow["outcome"],
                  ...Percentile.summarizeHistogram(g.h, q.minSamples)
                })
              )
              .sort((a, b) => byText(a.source, b.source) || byText(a.metric, b.metric) || byText(a.outcome, b.outcome))
          }
        )
      )
    },

    activeConfig: () =>
      mapped(Effect.map(sql<Row>`SELECT * FROM config_versions ORDER BY version DESC LIMIT 1`, (rows) => (rows.length === 0 ? null : Codec.configVersion(rows[0])))),

    applyConfig: (document, appliedBy, now) =>
      retryConflicts(
        transaction(
          Effect.map(
            Effect.zipRight(
              dialect.configLock,
              sql<{ version: number }>`
              INSERT INTO config_versions (version, document, applied_by, applied_at)
              SELECT COALESCE(MAX(version), 0) + 1, ${dialect.json(document)}, ${appliedBy}, ${now} FROM config_versions
              RETURNING version`
            ),
            ([r]): Store.ConfigVersion => ({ version: Number(r.version), document, appliedBy, appliedAt: now })
          )
        ).pipe(
          // Applies wait for each other (configLock); should two still compute the same next version, the loser's primary-key violation is retried.
          Effect.mapError((e) => (e.reason === "constraint" ? new Errors.StoreError({ ...e, reason: "conflict" }) : e))
        )
      ),

    addDevice: (d) =>
      mapped(
        Effect.map(
          sql<{ id: number }>`INSERT INTO devices (name, slots, token_hash, created_at) VALUES (${d.name}, ${d.slots}, ${d.tokenHash}, ${d.now}) RETURNING id`,
          ([r]): Store.Device => ({ id: Number(r.id), name: d.name, slots: d.slots, createdAt: d.now, revokedAt: null, containment: null, reportedAt: null })
        )
      ),

    deviceByTokenHash: (tokenHash) =>
      mapped(
        Effect.map(sql<Row>`SELECT * FROM devices WHERE token_hash = ${tokenHash} AND revoked_at IS NULL ORDER BY id LIMIT 1`, (rows) =>
          rows.length === 0 ? null : Codec.device(rows[0])
        )
      ),

    revokeDevice: (id, now) =>
      Effect.flatMap(
        isId(id)
          ? transaction(
              Effect.zipLeft(sql<Row>`UPDATE devices SET revoked_at = COALESCE(revoked_at, ${now}) WHERE id = ${id} RETURNING id`, dialect.revocationLock)
            )
          : Effect.succeed([]),
        (rows) => (rows.length === 0 ? Effect.fail(new Errors.NotFound({ entity: "device", key: String(id) })) : Effect.void)
      ),

    reportDevice: (id, report) =>
      Effect.flatMap(
        isId(id)
          ? mapped(sql<Row>`UPDATE devices SET containment = ${report.containment}, reported_at = ${report.now} WHERE id = ${id} AND revoked_at IS NULL RETURNING *`)
          : Effect.succeed([]),
        (rows) => (rows.length === 0 ? Effect.fail(new Errors.NotFound({ entity: "device", key: String(id) })) : Effect.succeed(Codec.device(rows[0])))
      ),

    // Written once by migration 0007 and never changed, so one read serves the store's lifetime.
    fleet: () => Effect.flatMap(Ref.get(fleetRead), (f) => (f !== null ? Effect.succeed(f) : Effect.tap(readFleet, (read) => Ref.set(fleetRead, read))))
  }

  // Claims of one slot or several, in one transaction; it names the exact reason of a refusal.
  function claimSlots(req: Store.ClaimManyRequest): Effect.Effect<ReadonlyArray<Assignment.Assignment>, Errors.ClaimRejected | Errors.StoreError> {
    // A slot taken by a concurrent claim after the reads below: the run again reads it as taken.
    // The policies are interned before, outside the transaction: a rollback keeps no id.
    return Effect.flatMap(policies(req.config), (interned) =>
      Effect.retry(claimSlotsOnce(req, interned), { while: (e) => e instanceof Errors.StoreError && e.reason === "constraint", times: 2 })
    )
  }
  function claimSlotsOnce(req: Store.ClaimManyRequest, interned: Policies.Interned): Effect.Effect<ReadonlyArray<Assignment.Assignment>, Errors.ClaimRejected | Errors.StoreError> {
    return transaction(
      Effect.gen(function* () {
        const unknown = new Errors.ClaimRejected({ reason: "unknown_device", message: `device ${req.deviceId} is not registered or was revoked` })
        if (!isId(req.deviceId)) return yield* unknown
        // The device row lock serialises this device's transactional claims and a revocation; a fast
        // claim in flight for the same slot makes the insert below wait and then violate the slot index,
        // and the retry reads the slot as taken.
        const [d] = yield* sql<Row>`SELECT id, slots, revoked_at FROM devices WHERE id = ${req.deviceId}${forUpdate}`
        if (!d || d.revoked_at !== null) return yield* unknown
        const slots = Number(d.slots)
        const mine = yield* sql<{ slot: number; reservation_id: number; fence: number }>`SELECT slot, reservation_id, fence FROM assignments WHERE device_id = ${req.deviceId} AND state = 'active'`
        const refused = Claim.refuseSlots(slots, mine.map((a) => ({ slot: Number(a.slot), reservationId: Number(a.reservation_id), fence: Number(a.fence) })), req.slots)
        if (refused) return yield* refused
        if (req.slots.length === 0) return []
        if (req.sourceCap === undefined && isPg && fastClaimable(req, req.slots)) {
          // checked under the device's row lock: the one-statement claim takes every slot in order
          const taken = yield* claimStatementFor(req.slots.map((slot) => ({ deviceId: req.deviceId, slot, now: req.now })), req, interned, true)
          return req.slots.flatMap((_, i) => (taken.has(i) ? [taken.get(i)!] : []))
        }
        if (req.sourceCap === undefined) {
          const taken = [...(yield* claimBatch(sql, req, isPg, req.slots.length))].sort(Priority.compare)
          return taken.length === 0 ? [] : yield* insertAssignments(req.deviceId, slots, req, interned, taken, req.slots)
        }
        // A fleet-wide cap is a count over other devices' rows: serialise capped claims so two cannot both
        // see room, and take one target at a time, each stored before the next one is counted.
        yield* dialect.capLock
        const issued: Array<Assignment.Assignment> = []
        for (const slot of req.slots) {
          const t = yield* claimNext(sql, req, isPg)
          if (t === null) break
          issued.push(...(yield* insertAssignments(req.deviceId, slots, req, interned, [t], [slot])))
        }
        return issued
      })
    )
  }

  // Stores the reservations of targets just claimed, the i-th target for the i-th slot, in one statement.
  function insertAssignments(
    deviceId: number,
    deviceSlots: number,
    req: { readonly now: number; readonly config: Store.ClaimManyRequest["config"] },
    interned: Policies.Interned,
    taken: ReadonlyArray<Target.Target>,
    slots: ReadonlyArray<number>
  ) {
    const rows = taken.map((t, i) => ({ t, slot: slots[i], ...Deadline.issueFor(req.config, t.source, req.now) }))
    return Effect.map(
      sql<{ reservation_id: number; target_id: number }>`
        INSERT INTO assignments (target_id, source, identity, device_id, device_slots, slot, fence, policy_id, covered_remote_at,
          issued_at, scan_deadline, upload_deadline, expires_at, state)
        VALUES ${sql.join(", ", false)(
          rows.map(
            ({ t, slot, deadlines }) =>
              sql`(${t.id}, ${t.source}, ${t.identity}, ${deviceId}, ${deviceSlots}, ${slot}, ${t.fence}, ${policyId(interned, t.source)}, ${t.coveredRemoteAt},
                ${deadlines.issuedAt}, ${deadlines.scanDeadline}, ${deadlines.uploadDeadline}, ${deadlines.expiresAt}, 'active')`
          )
        )}
        RETURNING reservation_id, target_id`,
      (ids) => {
        const byTarget = new Map(ids.map((r) => [Number(r.target_id), Number(r.reservation_id)]))
        return rows.map(({ t, slot, policy, deadlines }) =>
          Assignment.issued(t, { reservationId: byTarget.get(t.id)!, deviceId, slot }, policy, deadlines)
        )
      }
    )
  }

  // Postgres, without a fleet-wide cap: claims of any devices' slots in one statement of fixed
  // text, the i-th request taking the i-th lowest pending target. A request's device is read
  // without a lock (claims write nothing to it; a revocation waits for the claims in flight under
  // its own lock, Dialect.revocationLock, and a claim that waited for it sees it); its slot must be in range and free in the
  // statement's snapshot, and the schema refuses the rest: a slot taken since by a concurrent
  // claim violates the one-active-reservation-per-slot index, and that index with the slot
  // range keeps a device within its capacity. Deadlines are the request's time plus the
  // offsets of its source's policy row, read from `policies` by the configuration's interned ids
  // (core's Deadline.issue offsets, stored with the policy). With `whole`, every
  // request must pass or none is taken (a device's batch). The answers by request index; a
  // request left out (a refusal, an empty queue) is for the transaction. Null: the schema
  // refused the statement (every request goes to the transaction).
  function claimFast(
    reqs: ReadonlyArray<{ readonly deviceId: number; readonly slot: number; readonly now: number }>,
    shared: Pick<Store.ClaimRequest, "config" | "sources">,
    whole: boolean
  ): Effect.Effect<ReadonlyMap<number, Assignment.Assignment> | null, Errors.StoreError> {
    return Effect.flatMap(policies(shared.config), (interned) => retryConflicts(mapped(claimStatementFor(reqs, shared, interned, whole)))).pipe(
      // The schema refused a slot taken meanwhile: the transaction names the reason.
      Effect.catchIf((e) => e.reason === "constraint", () => Effect.succeed(null))
    )
  }

  // The statement of claimFast, also run by the claim transaction once its checks passed.
  function claimStatementFor(
    reqs: ReadonlyArray<{ readonly deviceId: number; readonly slot: number; readonly now: number }>,
    shared: Pick<Store.ClaimRequest, "config" | "sources">,
    interned: Policies.Interned,
    whole: boolean
  ) {
    return Effect.map(
      sql<Row>`${sql.literal(Prepared.marker)}
        WITH req AS (
          SELECT r.*, NULL::bigint AS freed FROM unnest(${reqs.map((r) => r.deviceId)}::bigint[], ${reqs.map((r) => r.slot)}::int[], ${reqs.map((r) => r.now)}::bigint[])
            WITH ORDINALITY AS r(device_id, slot, now, ord)
        ), ${claimSteps(shared, interned, whole)}
        SELECT ct.*, ins.reservation_id AS fast_reservation_id FROM ct JOIN ins ON ins.target_id = ct.id`,
      (rows) => {
        const out = new Map<number, Assignment.Assignment>()
        for (const r of rows) out.set(Number(r.r_ord) - 1, claimedRow(r, reqs, shared))
        return out
      }
    )
  }

  // The reservation a claim statement's row stands for (the request it answers by `r_ord`, from 1).
  function claimedRow(r: Row, reqs: ReadonlyArray<{ readonly deviceId: number; readonly slot: number; readonly now: number }>, shared: Pick<Store.ClaimRequest, "config">) {
    const t = Codec.target(r)
    const q = reqs[Number(r.r_ord) - 1]
    const { policy, deadlines } = Deadline.issueFor(shared.config, t.source, q.now)
    return Assignment.issued(t, { reservationId: Number(r.fast_reservation_id), deviceId: q.deviceId, slot: q.slot }, policy, deadlines)
  }

  // The claim's common table expressions after `req` (device_id, slot, now, ord from 1, and `freed`:
  // a reservation of that slot the same statement ends before, or null). `ct` holds the claimed
  // targets with their request's `r_ord` and `r_freed`, `ins` the reservations stored for them.
  function claimSteps(shared: Pick<Store.ClaimRequest, "sources">, interned: Policies.Interned, whole: boolean) {
    const sources = shared.sources ?? Source.sources
    return sql`pol AS (
          SELECT id, source, scan_ms::bigint AS scan_ms, upload_ms::bigint AS upload_ms, expiry_ms::bigint AS expiry_ms FROM policies WHERE id = ANY (${interned.ids}::int[])
        ), ok AS (
          SELECT req.*, d.slots FROM req JOIN devices d ON d.id = req.device_id
          WHERE d.revoked_at IS NULL AND req.slot >= 0 AND req.slot < d.slots
            -- a subplan run for each request (OFFSET 0 keeps it from becoming an anti join), so it probes
            -- the slot index by (device, slot): planned after an analyse that found few active
            -- reservations, the anti join scanned a whole partial index for each request, over every
            -- entry ended reservations left in it until a vacuum (1,300 buffers a claim; with 0015 the
            -- expiry index cannot serve this check at all; plans.test.ts). The reservation this
            -- statement ends on the slot still reads as active here, in the statement's snapshot.
            AND NOT EXISTS (SELECT 1 FROM assignments a WHERE a.device_id = d.id AND a.state = 'active' AND a.slot = req.slot
              AND a.reservation_id IS DISTINCT FROM req.freed OFFSET 0)
        ), g AS (
          SELECT ok.*, row_number() OVER (ORDER BY ok.ord) AS k FROM ok
          WHERE NOT ${whole}::bool OR (SELECT count(*) FROM ok) = (SELECT count(*) FROM req)
        ), pick AS (
          -- the claim order from claim_head (migration 0013), each target locked (SKIP LOCKED), as many as asked
          SELECT c.id, row_number() OVER (ORDER BY c.key, c.id) AS k FROM scanfleet_claimable(${sources}::text[], (SELECT count(*) FROM g)) c
        ), ct AS (
          UPDATE targets SET status = 'in_progress', covered_remote_at = observed_remote_at, fence = fence + 1,
            last_scan_started_at = g.now, attempts = attempts + 1
          FROM pick JOIN g ON g.k = pick.k
          WHERE targets.id = pick.id AND targets.status = 'pending'
          RETURNING ${sql.literal(Codec.targetColumns.split(", ").map((c) => `targets.${c}`).join(", "))}, g.device_id AS r_device, g.slot AS r_slot, g.slots AS r_slots, g.now AS r_now, g.ord AS r_ord, g.freed AS r_freed
        ), ins AS (
          INSERT INTO assignments (target_id, source, identity, device_id, device_slots, slot, fence, policy_id, covered_remote_at,
            issued_at, scan_deadline, upload_deadline, expires_at, state)
          SELECT ct.id, ct.source, ct.identity, ct.r_device, ct.r_slots, ct.r_slot, ct.fence, pol.id, ct.covered_remote_at,
            ct.r_now, ct.r_now + pol.scan_ms, ct.r_now + pol.upload_ms, ct.r_now + pol.expiry_ms, 'active'
          FROM ct JOIN pol ON pol.source = ct.source
          RETURNING reservation_id, target_id
        )`
  }

  // One statement for any number of observations: columns as arrays (Postgres) or one JSON
  // document (SQLite), never one bind parameter per value, which would hit the protocol's cap.
  function insertDurations(ds: ReadonlyArray<Assignment.Duration>) {
    if (ds.length === 0) return Effect.void
    return Effect.asVoid(
      isPg
        ? sql`INSERT INTO durations (source, metric, outcome, ms, at)
            SELECT * FROM unnest(${ds.map((d) => d.source)}::text[], ${ds.map((d) => d.metric)}::text[], ${ds.map((d) => d.outcome)}::text[],
              ${ds.map((d) => Percentile.storedMs(d.ms))}::float8[], ${ds.map((d) => d.at)}::bigint[])`
        : sql`INSERT INTO durations (source, metric, outcome, ms, at)
            SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4
            FROM json_each(${JSON.stringify(ds.map((d) => [d.source, d.metric, d.outcome, Percentile.storedMs(d.ms), d.at]))}) AS j ORDER BY j.key`
    )
  }

  return store
})

// Configurations whose policies are equal issue the same reservations, so their claims may share a
// statement: a server reads its configuration afresh for each request, a new object each time.
const sameConfig = (a: Store.ClaimRequest["config"], b: Store.ClaimRequest["config"]) => a === b || Policies.rowsOf(a).key === Policies.rowsOf(b).key

// Sources in a request: absent means all of them.
const sameSources = (a: ReadonlyArray<Source.Source> | undefined, b: ReadonlyArray<Source.Source> | undefined) =>
  a === b || (a !== undefined && b !== undefined && a.length === b.length && a.every((s, i) => s === b[i]))

// The id of a source's interned policy: every configured source has one, and a claim takes only configured sources.
const policyId = (interned: Policies.Interned, source: Source.Source): number => {
  const id = interned.bySource.get(source)
  if (id === undefined) throw new Error(`no policy is configured for ${source}`)
  return id
}

// The one-statement claim applies when the ids are integers and every source the claim may take
// has a policy with whole-millisecond offsets; anything else is left to the transaction.
const fastClaimable = (req: Pick<Store.ClaimRequest, "deviceId" | "now" | "config" | "sources">, slots: ReadonlyArray<number>) => {
  if (![req.deviceId, req.now, ...slots].every(Number.isSafeInteger) || slots.length === 0) return false
  const { rows, exact } = Policies.rowsOf(req.config)
  return exact && (req.sources ?? Source.sources).every((s) => rows.some((r) => r.source === s))
}

