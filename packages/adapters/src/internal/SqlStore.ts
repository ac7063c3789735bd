import { SqlClient, Statement } from "@effect/sql"
import { Effect, Either, Schedule } from "effect"
import { Assignment, Claim, Deadline, Errors, Findings, Percentile, Source, Store, type Target } from "@scanfleet/core"
import * as Codec from "./Codec.js"
import * as Rollups from "./Rollups.js"
import * as Prepared from "./Prepared.js"
import * as Rules from "./Rules.js"
import { mapped } from "./SqlErrors.js"
import { claimBatch, claimNext, claimStatement } from "./queries/claimNext.js"
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
 * statements; where they differ (row locks, batch shapes, percentiles) the
 * dialect is chosen here. Every method is one statement or one transaction,
 * and every SqlError leaves as a StoreError.
 */
export const make: Effect.Effect<Store.StoreShape, never, SqlClient.SqlClient> = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const isPg = sql.onDialectOrElse({ pg: () => true, orElse: () => false })
  const forUpdate = sql.literal(isPg ? " FOR UPDATE" : "")

  // SQLite's client opens transactions with a deferred BEGIN; a first no-op
  // write takes the database's write lock at once, as BEGIN IMMEDIATE would, so
  // a transaction never reads and then fails to upgrade (SQLITE_BUSY).
  const writeLock = isPg ? Effect.void : sql`UPDATE targets SET fence = fence WHERE 0`
  // A deadlock or serialization failure aborted the whole statement or transaction
  // before anything was committed: it is safe to run again.
  const retryConflicts = <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
    Effect.retry(self, {
      while: (e: E) => e instanceof Errors.StoreError && e.reason === "conflict",
      schedule: Schedule.intersect(Schedule.exponential("5 millis"), Schedule.recurs(4))
    })
  const transaction = <A, E, R>(self: Effect.Effect<A, E, R>) =>
    retryConflicts(mapped(sql.withTransaction(Effect.zipRight(writeLock, self))))
  const jsonParam = (v: unknown) => (isPg ? sql`${JSON.stringify(v)}::jsonb` : sql`${JSON.stringify(v)}`)

  const loadAssignment = (reservationId: number, lock: boolean) =>
    isId(reservationId)
      ? Effect.map(
          sql<Row>`SELECT * FROM assignments WHERE reservation_id = ${reservationId}${lock ? forUpdate : sql.literal("")}`,
          (rows) => (rows.length === 0 ? undefined : Codec.assignment(rows[0]))
        )
      : Effect.succeed(undefined)

  const loadTarget = (id: number) =>
    Effect.map(sql<Row>`SELECT ${sql.literal(Codec.targetColumns)} FROM targets WHERE id = ${id}${forUpdate}`, (rows) => Codec.target(rows[0]))

  // Ownership and fence first, then the caller's own checks, as core's model orders them.
  const authorized = (auth: { deviceId: number; reservationId: number; fence: number }) =>
    Effect.flatMap(loadAssignment(auth.reservationId, true), (a) => Either.match(Rules.authorize(auth, a), { onLeft: Effect.fail, onRight: Effect.succeed }))

  const live = (a: Assignment.Assignment, now: number) => Either.match(Rules.requireLive(a, now), { onLeft: Effect.fail, onRight: Effect.succeed })

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

  const store: Store.StoreShape = {
    recordObservations: (batch, now) =>
      retryConflicts(isPg ? mapped(Record.pg(sql, batch, now)) : transaction(Record.sqlite(sql, batch, now))),

    promote: (source, rule, now) =>
      Source.hasRemoteTimestamp(source)
        ? retryConflicts(isPg ? mapped(Promote.pg(sql, source, rule, now)) : transaction(Promote.sqlite(sql, source, rule, now)))
        : Effect.succeed({ promoted: [], deferred: 0 }),

    claim: (req) =>
      Effect.flatMap(isPg && req.sourceCap === undefined ? claimFast({ ...req, slots: [req.slot] }) : Effect.succeed(null), (fast) =>
        Effect.map(fast !== null ? Effect.succeed(fast) : claimSlots({ ...req, slots: [req.slot] }), (as) => as[0] ?? null)
      ),

    claimMany: (req) =>
      Effect.flatMap(isPg && req.sourceCap === undefined ? claimFast(req) : Effect.succeed(null), (fast) => (fast !== null ? Effect.succeed(fast) : claimSlots(req))),

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

    submitResult: (input) =>
      !isPg
        ? retryConflicts(mapped(sql.withTransaction(Submit.sqlite(sql, input, insertDurations))))
        : Effect.flatMap(submitFast(input), (fast) =>
        fast !== null
          ? Effect.succeed(fast)
          : transaction(
        Effect.gen(function* () {
          const a = yield* authorized(input)
          const prior = yield* sql<Row>`SELECT * FROM results WHERE reservation_id = ${a.reservationId}`
          if (prior.length > 0) return Codec.receipt(prior[0])
          yield* live(a, input.now)
          if (input.now > a.uploadDeadline)
            return yield* Rules.refuse("upload_deadline_passed", a.reservationId, `the result-upload deadline passed at ${new Date(a.uploadDeadline).toISOString()}`)
          const t = yield* loadTarget(a.targetId)
          if (!Claim.holds(t, a.fence)) return yield* Rules.lostTarget(a, t.id)
          const evs = (yield* sql<Row>`SELECT * FROM progress_events WHERE reservation_id = ${a.reservationId} ORDER BY seq`).map(Codec.event)
          return yield* Submit.writeAccepted(sql, input, a, t, evs, insertDurations)
        })
      )
      ),

    submitResults: (inputs) =>
      Effect.gen(function* () {
        // Postgres takes the common accepted results in one statement (each reservation once); the
        // rest (refusals, repeats, races) and every result on SQLite are judged one by one.
        const seen = new Set<number>()
        const batch = isPg
          ? inputs.filter((i) => [i.reservationId, i.deviceId, i.fence, i.now].every(isId) && !Findings.carriesFindings(i.outcome, i.body) && !seen.has(i.reservationId) && seen.add(i.reservationId))
          : []
        const accepted =
          batch.length === 0
            ? new Map<number, Assignment.Receipt>()
            : yield* retryConflicts(mapped(SubmitResults.acceptMany(sql, batch))).pipe(
                Effect.catchIf((e) => e.reason === "constraint", () => Effect.succeed(new Map<number, Assignment.Receipt>()))
              )
        const answers: Array<Either.Either<Assignment.Receipt, Errors.ReservationRefused>> = []
        for (const input of inputs) {
          const receipt = accepted.get(input.reservationId)
          if (receipt !== undefined && receipt.acceptedAt === input.now && receipt.receiptId === `rc-${input.reservationId}-${input.fence}`) {
            accepted.delete(input.reservationId)
            answers.push(Either.right(receipt))
          } else
            answers.push(
              yield* store.submitResult(input).pipe(
                Effect.map((r) => Either.right(r)),
                Effect.catchTag("ReservationRefused", (e) => Effect.succeed(Either.left(e)))
              )
            )
        }
        return answers
      }),

    release: (auth) =>
      transaction(
        Effect.gen(function* () {
          const a = yield* Effect.flatMap(authorized(auth), (a) => live(a, auth.now))
          const t = yield* loadTarget(a.targetId)
          if (!Claim.holds(t, a.fence)) return yield* Rules.lostTarget(a, t.id)
          yield* sql`UPDATE targets SET status = 'pending', fence = fence + 1 WHERE id = ${t.id} AND status = 'in_progress' AND fence = ${a.fence}`
          yield* sql`UPDATE assignments SET state = 'released', ended_at = ${auth.now} WHERE reservation_id = ${a.reservationId}`
          return { ...a, state: "released", endedAt: auth.now } satisfies Assignment.Assignment
        })
      ),

    // The sweep also folds the percentile deltas result acceptance left (Postgres), after its
    // transaction: they never pile up between percentile queries while a fleet is running.
    expireDue: (req) =>
      Effect.tap(transaction(
        Effect.gen(function* () {
          const limit = Math.max(0, Math.floor(req.limit))
          if (limit === 0) return []
          // SKIP LOCKED: two sweepers expire disjoint sets; a reservation being completed right now is left alone.
          const due = (yield* sql<Row>`
            SELECT * FROM assignments WHERE state = 'active' AND expires_at <= ${req.now}
            ORDER BY expires_at, reservation_id LIMIT ${limit}${isPg ? sql.literal(" FOR UPDATE SKIP LOCKED") : sql.literal("")}`).map(Codec.assignment)
          if (due.length === 0) return []
          const ids = due.map((a) => a.reservationId)
          yield* sql`
            UPDATE targets SET status = CASE WHEN attempts < CAST(${req.maxAttempts} AS DOUBLE PRECISION) THEN 'pending' ELSE 'failed' END, fence = fence + 1
            WHERE status = 'in_progress' AND (id, fence) IN (SELECT target_id, fence FROM assignments WHERE reservation_id IN ${sql.in(ids)})`
          yield* sql`
            UPDATE assignments SET state = 'expired', ended_at = ${req.now}, expired_at = ${req.now},
              expiry_last_phase = last_phase, expiry_last_progress_at = last_progress_at
            WHERE reservation_id IN ${sql.in(ids)}`
          return due.map(
            (a): Assignment.Assignment => ({
              ...a,
              state: "expired",
              endedAt: req.now,
              expiry: { lastPhase: a.lastPhase, lastProgressAt: a.lastProgressAt, expiredAt: req.now }
            })
          )
        })
      ), () => (isPg ? retryConflicts(mapped(foldDeltas)) : Effect.void)),

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
        Effect.map(sql<Row>`SELECT * FROM assignments WHERE ${sql.and(filters)} ORDER BY reservation_id DESC LIMIT ${limit}`, (rows) => rows.map(Codec.assignment))
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
      isPg && ds.length > 0
        ? retryConflicts(mapped(sql.withTransaction(Effect.zipRight(sql`SELECT set_config('scanfleet.rollups_direct', 'on', true)`, insertDurations(ds)))))
        : mapped(insertDurations(ds)),

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
      const bytes = isPg ? ' COLLATE "C"' : ""
      // Whole days, six hours, hours and ten minutes come from the rollups, what is left at the two
      // ends from raw rows: counts of exactly the window, in log buckets.
      const parts = Rollups.plan(q.from, q.to).map((p) =>
        p._tag === "rollup"
          ? sql`SELECT source, metric, outcome, chunk, ${sql.literal(slots.map((i) => `c${i}`).join(", "))} FROM duration_rollups
              WHERE ${filters(sql`span = ${p.span} AND start >= ${p.from} AND start < ${p.to}`)}`
          : sql`SELECT source${sql.literal(bytes)} AS source, metric${sql.literal(bytes)} AS metric, outcome${sql.literal(bytes)} AS outcome,
              b >> 5 AS chunk, ${sql.literal(slots.map((i) => `CASE WHEN b & 31 = ${i} THEN 1 ELSE 0 END AS c${i}`).join(", "))}
              FROM (SELECT source, metric, outcome, ${sql.literal(Rollups.bucketSql("ms"))} AS b FROM durations
                WHERE ${filters(sql`at >= ${p.from} AND at < ${p.to}`)}) AS r`
      )
      if (parts.length === 0) return Effect.succeed([])
      return mapped(
        Effect.map(
          Effect.zipRight(
            foldDeltas,
            sql<Row>`
            SELECT source, metric, outcome, chunk, ${sql.literal(slots.map((i) => `CAST(sum(c${i}) AS DOUBLE PRECISION) AS c${i}`).join(", "))}
            FROM (${sql.join(" UNION ALL ", false)(parts)}) AS u
            GROUP BY source, metric, outcome, chunk`
          ),
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
            sql<{ version: number }>`
              INSERT INTO config_versions (version, document, applied_by, applied_at)
              SELECT COALESCE(MAX(version), 0) + 1, ${jsonParam(document)}, ${appliedBy}, ${now} FROM config_versions
              RETURNING version`,
            ([r]): Store.ConfigVersion => ({ version: Number(r.version), document, appliedBy, appliedAt: now })
          )
        ).pipe(
          // Two concurrent applies compute the same next version; the loser's primary-key violation is retried.
          Effect.mapError((e) => (e.reason === "constraint" ? new Errors.StoreError({ ...e, reason: "conflict" }) : e))
        )
      ),

    addDevice: (d) =>
      mapped(
        Effect.map(
          sql<{ id: number }>`INSERT INTO devices (name, slots, token_hash, created_at) VALUES (${d.name}, ${d.slots}, ${d.tokenHash}, ${d.now}) RETURNING id`,
          ([r]): Store.Device => ({ id: Number(r.id), name: d.name, slots: d.slots, createdAt: d.now, revokedAt: null })
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
        isId(id) ? mapped(sql<Row>`UPDATE devices SET revoked_at = COALESCE(revoked_at, ${now}) WHERE id = ${id} RETURNING id`) : Effect.succeed([]),
        (rows) => (rows.length === 0 ? Effect.fail(new Errors.NotFound({ entity: "device", key: String(id) })) : Effect.void)
      )
  }

  // Claims of one slot or several, in one transaction; it names the exact reason of a refusal.
  function claimSlots(req: Store.ClaimManyRequest): Effect.Effect<ReadonlyArray<Assignment.Assignment>, Errors.ClaimRejected | Errors.StoreError> {
    return transaction(
      Effect.gen(function* () {
        const unknown = new Errors.ClaimRejected({ reason: "unknown_device", message: `device ${req.deviceId} is not registered or was revoked` })
        if (!isId(req.deviceId)) return yield* unknown
        // The device row lock serialises this device's transactional claims and waits for its fast
        // claims in flight (they hold a share lock on the row), so the reads below are exact.
        const [d] = yield* sql<Row>`SELECT id, slots, revoked_at FROM devices WHERE id = ${req.deviceId}${forUpdate}`
        if (!d || d.revoked_at !== null) return yield* unknown
        const slots = Number(d.slots)
        const mine = yield* sql<{ slot: number }>`SELECT slot FROM assignments WHERE device_id = ${req.deviceId} AND state = 'active'`
        const refused = Claim.refuseSlots(slots, mine.map((a) => Number(a.slot)), req.slots)
        if (refused) return yield* refused
        if (req.slots.length === 0) return []
        if (req.sourceCap === undefined) {
          const taken = [...(yield* claimBatch(sql, req, isPg, req.slots.length))].sort((a, b) => a.id - b.id)
          return taken.length === 0 ? [] : yield* insertAssignments(req.deviceId, slots, req, taken, req.slots)
        }
        // A fleet-wide cap is a count over other devices' rows: serialise capped claims so two cannot both
        // see room, and take one target at a time, each stored before the next one is counted.
        if (isPg) yield* sql`SELECT pg_advisory_xact_lock(${CAP_LOCK})`
        const issued: Array<Assignment.Assignment> = []
        for (const slot of req.slots) {
          const t = yield* claimNext(sql, req, isPg)
          if (t === null) break
          issued.push(...(yield* insertAssignments(req.deviceId, slots, req, [t], [slot])))
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
    taken: ReadonlyArray<Target.Target>,
    slots: ReadonlyArray<number>
  ) {
    const rows = taken.map((t, i) => ({ t, slot: slots[i], ...Deadline.issueFor(req.config, t.source, req.now) }))
    return Effect.map(
      sql<{ reservation_id: number; target_id: number }>`
        INSERT INTO assignments (target_id, source, identity, device_id, device_slots, slot, fence, policy, covered_remote_at,
          issued_at, scan_deadline, upload_deadline, expires_at, state)
        VALUES ${sql.join(", ", false)(
          rows.map(
            ({ t, slot, policy, deadlines }) =>
              sql`(${t.id}, ${t.source}, ${t.identity}, ${deviceId}, ${deviceSlots}, ${slot}, ${t.fence}, ${jsonParam(policy)}, ${t.coveredRemoteAt},
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

  // Postgres, without a fleet-wide cap: the common successful claim of one slot or of a batch, in
  // one statement. The device row is read with a share lock (claims of one device do not wait for
  // each other; a revocation waits for them, and a claim that waited for a revocation sees it),
  // every listed slot must be in range and free in the statement's snapshot, and the schema refuses
  // the rest: a slot taken since by a concurrent claim violates the one-active-reservation-per-slot
  // index, and that index with the slot range keeps the device within its capacity. Any miss (a
  // refusal, an empty queue, such a violation) yields null and the transaction decides; when the
  // queue holds fewer targets than slots, the batch returns what it took.
  function claimFast(req: Store.ClaimManyRequest): Effect.Effect<ReadonlyArray<Assignment.Assignment> | null, Errors.StoreError> {
    if (![req.deviceId, req.now].every(isId) || req.slots.length === 0 || !req.slots.every(isId) || new Set(req.slots).size !== req.slots.length)
      return Effect.succeed(null)
    // Issued for every source it may take; a source the configuration cannot issue for is left to the transaction.
    const candidates = (req.sources ?? Source.sources).filter((s) => req.config.sources[s] !== undefined)
    if (candidates.length === 0 || candidates.length !== (req.sources ?? Source.sources).length) return Effect.succeed(null)
    const issued = new Map(candidates.map((s) => [s, Deadline.issueFor(req.config, s, req.now)] as const))
    const pick = (f: (i: ReturnType<typeof Deadline.issueFor>) => Statement.Fragment) =>
      sql`CASE p.source ${sql.join(" ", false)([...issued].map(([s, i]) => sql`WHEN ${s}::text THEN ${f(i)}`))} END`
    const gate = sql`EXISTS (SELECT 1 FROM g)`
    return retryConflicts(
      mapped(
        Effect.map(
          sql<Row>`${sql.literal(Prepared.marker)}
            WITH req AS (
              SELECT r.slot, r.ord FROM unnest(${req.slots}::int[]) WITH ORDINALITY AS r(slot, ord)
            ), g AS (
              SELECT d.id, d.slots FROM devices d
              WHERE d.id = ${req.deviceId}::bigint AND d.revoked_at IS NULL
                AND NOT EXISTS (SELECT 1 FROM req WHERE req.slot < 0 OR req.slot >= d.slots)
                AND NOT EXISTS (
                  SELECT 1 FROM assignments a WHERE a.device_id = d.id AND a.state = 'active' AND a.slot = ANY (${req.slots}::int[]))
              FOR SHARE
            ), t AS (${claimStatement(sql, req, true, gate, req.slots.length)}
            ), p AS (
              SELECT t.*, row_number() OVER (ORDER BY t.id) AS ord FROM t
            ), ins AS (
              INSERT INTO assignments (target_id, source, identity, device_id, device_slots, slot, fence, policy, covered_remote_at,
                issued_at, scan_deadline, upload_deadline, expires_at, state)
              SELECT p.id, p.source, p.identity, g.id, g.slots, req.slot, p.fence,
                ${pick((i) => sql`${JSON.stringify(i.policy)}::jsonb`)}, p.covered_remote_at,
                ${pick((i) => sql`${i.deadlines.issuedAt}::bigint`)}, ${pick((i) => sql`${i.deadlines.scanDeadline}::bigint`)},
                ${pick((i) => sql`${i.deadlines.uploadDeadline}::bigint`)}, ${pick((i) => sql`${i.deadlines.expiresAt}::bigint`)}, 'active'
              FROM p JOIN req ON req.ord = p.ord CROSS JOIN g
              RETURNING reservation_id, target_id, slot
            )
            SELECT p.*, ins.reservation_id AS fast_reservation_id, ins.slot AS fast_slot FROM p JOIN ins ON ins.target_id = p.id ORDER BY p.id`,
          (rows) =>
            rows.length === 0
              ? null
              : rows.map((r) => {
                  const t = Codec.target(r)
                  const { policy, deadlines } = issued.get(t.source)!
                  return Assignment.issued(t, { reservationId: Number(r.fast_reservation_id), deviceId: req.deviceId, slot: Number(r.fast_slot) }, policy, deadlines)
                })
        )
      ).pipe(
        // The schema refused a slot taken meanwhile: the transaction names the reason.
        Effect.catchIf((e) => e.reason === "constraint", () => Effect.succeed(null))
      )
    )
  }

  // Postgres: the common accepted result in one statement. The locked reservation row
  // gates every write; its version must equal the one in the statement's snapshot, so the
  // timeline read for durations is current (progress is only stored under that row's lock
  // together with an update of it). Any miss (refusal, repeat, race) yields null and the
  // transactional path decides, with its exact reason.
  function submitFast(input: Store.ResultInput): Effect.Effect<Assignment.Receipt | null, Errors.StoreError> {
    if (![input.reservationId, input.deviceId, input.fence, input.now].every(isId)) return Effect.succeed(null)
    // Findings are written by the transactional path (the statement also declines a target with open findings).
    if (Findings.carriesFindings(input.outcome, input.body)) return Effect.succeed(null)
    const status = Assignment.targetStatusAfter(input.outcome)
    const receipt: Assignment.Receipt = {
      receiptId: `rc-${input.reservationId}-${input.fence}`,
      reservationId: input.reservationId,
      outcome: input.outcome,
      acceptedAt: input.now
    }
    const now = sql`${input.now}::bigint`
    const outcome = sql`${input.outcome}::text`
    const setTarget = status === "completed" ? sql`status = 'completed', completed_at = ${now}` : sql`status = ${status}::text`
    return retryConflicts(
      mapped(
        Effect.map(
          sql<{ reservation_id: number }>`${sql.literal(Prepared.marker)}
            WITH locked AS (
              SELECT reservation_id, target_id, source, issued_at, fence, xmin::text AS v FROM assignments
              WHERE reservation_id = ${input.reservationId}::bigint AND device_id = ${input.deviceId}::bigint AND fence = ${input.fence}::bigint
                AND state = 'active' AND expires_at > ${now} AND upload_deadline >= ${now}
                AND NOT EXISTS (SELECT 1 FROM findings f WHERE f.target_id = assignments.target_id AND f.status <> 'resolved')
              FOR UPDATE
            ), a AS (
              SELECT l.* FROM locked l JOIN assignments s ON s.reservation_id = l.reservation_id AND s.xmin::text = l.v
            ), t AS (
              UPDATE targets SET ${setTarget} FROM a
              WHERE targets.id = a.target_id AND targets.status = 'in_progress' AND targets.fence = a.fence
              RETURNING a.reservation_id, a.source, a.issued_at
            ), r AS (
              INSERT INTO results (reservation_id, receipt_id, outcome, accepted_at, body)
              SELECT reservation_id, ${receipt.receiptId}::text, ${outcome}, ${now}, ${input.body}::text FROM t
            ), u AS (
              UPDATE assignments SET state = ${status === "completed" ? "completed" : "failed"}::text, outcome = ${outcome},
                final_phase = ${input.finalPhase}::text, ended_at = ${now}
              FROM t WHERE assignments.reservation_id = t.reservation_id
            ), ev AS (
              -- Spans as core's PhaseModel.spans builds them: recovery events do not split a phase.
              SELECT seq, phase, at, accepted_at, lead(phase) OVER w AS next_phase, lead(at) OVER w AS next_at
              FROM progress_events WHERE reservation_id = ${input.reservationId}::bigint AND kind <> 'recovered'
              WINDOW w AS (ORDER BY seq)
            ), d AS (
              SELECT 0 AS k, 0 AS seq, t.source, 'end_to_end' AS metric, GREATEST(0, ${now} - t.issued_at)::float8 AS ms FROM t
              UNION ALL
              SELECT 1, ev.seq, t.source, ev.phase, GREATEST(0, ev.next_at - ev.at)::float8 FROM t, ev
              WHERE ev.phase IN ('scanning', 'cleanup', 'bundling') AND ev.next_phase IS NOT NULL
                AND ev.next_phase NOT IN ('completed', 'timed_out', 'failed')
              UNION ALL
              SELECT 2, 0, t.source, 'upload', GREATEST(0, ${now} - up.accepted_at)::float8
              FROM t, (SELECT accepted_at FROM ev WHERE phase = 'uploading' ORDER BY seq LIMIT 1) up
            ), ins AS (
              INSERT INTO durations (source, metric, outcome, ms, at)
              SELECT source, metric, ${outcome}, ms, ${now} FROM d ORDER BY k, seq
            )
            SELECT reservation_id FROM t`,
          (rows) => (rows.length === 0 ? null : receipt)
        )
      )
    )
  }

  // One statement for any number of observations: columns as arrays (Postgres) or one JSON
  // document (SQLite), never one bind parameter per value, which would hit the protocol's cap.
  function insertDurations(ds: ReadonlyArray<Assignment.Duration>) {
    if (ds.length === 0) return Effect.void
    return Effect.asVoid(
      isPg
        ? sql`INSERT INTO durations (source, metric, outcome, ms, at)
            SELECT * FROM unnest(${ds.map((d) => d.source)}::text[], ${ds.map((d) => d.metric)}::text[], ${ds.map((d) => d.outcome)}::text[],
              ${ds.map((d) => d.ms)}::float8[], ${ds.map((d) => d.at)}::bigint[])`
        : sql`INSERT INTO durations (source, metric, outcome, ms, at)
            SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4
            FROM json_each(${JSON.stringify(ds.map((d) => [d.source, d.metric, d.outcome, d.ms, d.at]))}) AS j ORDER BY j.key`
    )
  }

  return store
})

// The advisory lock key that serialises claims under a per-source cap ("sfcap" in ASCII).
const CAP_LOCK = 0x7366636170

