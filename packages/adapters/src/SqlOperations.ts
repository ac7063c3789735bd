import { SqlClient, type Statement } from "@effect/sql"
import { Effect, Layer, Schedule } from "effect"
import { type Assignment, Errors, Operations, Retry, Source } from "@scanfleet/core"
import * as Codec from "./internal/Codec.js"
import * as Dialect from "./internal/Dialect.js"
import { mapped } from "./internal/SqlErrors.js"
import * as Promote from "./internal/queries/promote.js"

type Row = { readonly [column: string]: unknown }

const isId = (n: number) => Number.isSafeInteger(n)
const numOrNull = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v))
const targetCols = Codec.targetColumns
  .split(", ")
  .map((c) => `t.${c}`)
  .join(", ")

const retryState = (r: Row): Retry.RedriveState =>
  r.r_target_id === null || r.r_target_id === undefined
    ? Retry.initialState
    : { redrives: Number(r.redrives), revision: numOrNull(r.revision), retryAt: numOrNull(r.retry_at), plannedFence: numOrNull(r.planned_fence) }

const auditEntry = (r: Row): Operations.AuditEntry => ({
  id: Number(r.id),
  at: Number(r.at),
  who: String(r.who),
  action: r.action as Operations.Action,
  subject: String(r.subject),
  why: String(r.why),
  detail: String(r.detail)
})

/**
 * The operator port over an `@effect/sql` client, for Postgres and SQLite alike (migration
 * 0008's tables). Core's rules (`Retry`, `Operations`) decide; each method is one transaction,
 * its authority changes compare-and-set on (status, fence) as the Store's are, and its audit
 * entry is written in the same transaction.
 *
 * @example
 * const ops = yield* SqlOperations.make
 */
export const make: Effect.Effect<Operations.OperationsShape, never, SqlClient.SqlClient> = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const isPg = sql.onDialectOrElse({ pg: () => true, orElse: () => false })
  const forUpdate = sql.literal(isPg ? " FOR UPDATE" : "")
  const { revocationLock, reservationWriter, inIds } = Dialect.of(sql)
  const lockTarget = sql.literal(isPg ? " FOR UPDATE OF t" : "")
  // As the Store does: SQLite takes its write lock first, so a transaction never fails to upgrade.
  const writeLock = isPg ? Effect.void : sql`UPDATE targets SET fence = fence WHERE 0`
  const transaction = <A, E, R>(self: Effect.Effect<A, E, R>) =>
    Effect.retry(mapped(sql.withTransaction(Effect.zipRight(writeLock, self))), {
      while: (e) => e instanceof Errors.StoreError && e.reason === "conflict",
      schedule: Schedule.intersect(Schedule.exponential("5 millis"), Schedule.recurs(4))
    })
  const greatest = (...xs: ReadonlyArray<string>) => sql.literal(`${isPg ? "GREATEST" : "max"}(${xs.join(", ")})`)
  // (id, fence) pairs as a subquery: one JSON parameter, however many rows.
  const pairs = (rows: ReadonlyArray<readonly [number, number]>) =>
    isPg
      ? sql`SELECT (j ->> 0)::bigint AS id, (j ->> 1)::int AS fence FROM json_array_elements(${JSON.stringify(rows)}::json) AS j`
      : sql`SELECT j.value ->> 0 AS id, j.value ->> 1 AS fence FROM json_each(${JSON.stringify(rows)}) AS j`

  // A target with its retry state and the end of its last assignment.
  const detailQuery = (where: Statement.Fragment, tail: Statement.Fragment = sql``) => sql<Row>`
    SELECT ${sql.literal(targetCols)}, r.target_id AS r_target_id, r.redrives, r.revision, r.retry_at, r.planned_fence,
      (SELECT max(a.ended_at) FROM assignments a WHERE a.target_id = t.id) AS last_ended
    FROM targets t LEFT JOIN target_retries r ON r.target_id = t.id
    WHERE ${where}${tail}`
  const detail = (r: Row): Operations.TargetDetail => {
    const t = Codec.target(r)
    return { ...t, redrive: retryState(r), changedAt: Operations.changedAt(t, numOrNull(r.last_ended)) }
  }
  const findTarget = (source: Source.Source, identity: string, lock: boolean) =>
    Effect.flatMap(detailQuery(sql`t.source = ${source} AND t.identity = ${identity}`, lock ? lockTarget : sql``), (rows) =>
      rows.length === 0 ? Effect.fail(new Errors.NotFound({ entity: "target", key: `${source}:${identity}` })) : Effect.succeed(detail(rows[0]))
    )

  const record = (action: Operations.Action, subject: string, d: unknown, actor: Operations.Actor) =>
    Effect.map(
      sql<Row>`INSERT INTO audit_log (at, who, action, subject, why, detail) VALUES (${actor.now}, ${actor.who}, ${action}, ${subject}, ${actor.why}, ${JSON.stringify(d ?? {})})
        RETURNING id, at, who, action, subject, why, detail`,
      ([r]) => auditEntry(r)
    )

  const saveStates = (states: ReadonlyArray<readonly [number, Retry.RedriveState]>) =>
    states.length === 0
      ? Effect.void
      : Effect.asVoid(sql`
          INSERT INTO target_retries (target_id, redrives, revision, retry_at, planned_fence)
          VALUES ${sql.join(", ", false)(states.map(([id, s]) => sql`(${id}, ${s.redrives}, ${s.revision}, ${s.retryAt}, ${s.plannedFence})`))}
          ON CONFLICT (target_id) DO UPDATE SET redrives = excluded.redrives, revision = excluded.revision,
            retry_at = excluded.retry_at, planned_fence = excluded.planned_fence`)

  // Ends active reservations as released and gives their targets back, fenced like a release.
  const endAll = (as: ReadonlyArray<Assignment.Assignment>, now: number) =>
    Effect.gen(function* () {
      if (as.length === 0) return []
      yield* sql`
        UPDATE targets SET status = 'pending', fence = fence + 1
        WHERE status = 'in_progress' AND (id, fence) IN (${pairs(as.map((a) => [a.targetId, a.fence] as const))})`
      yield* sql`UPDATE assignments SET state = 'released', ended_at = ${now} WHERE state = 'active' AND reservation_id ${inIds(as.map((a) => a.reservationId))}`
      return as.map((a): Assignment.Assignment => ({ ...a, state: "released", endedAt: now }))
    })

  const insertCancellations = (cs: ReadonlyArray<Operations.Cancellation>) =>
    cs.length === 0
      ? Effect.void
      : sql`INSERT INTO cancellations (reservation_id, at, who, why) VALUES ${sql.join(", ", false)(cs.map((c) => sql`(${c.reservationId}, ${c.at}, ${c.who}, ${c.why})`))}`

  const controls = Effect.map(sql<Row>`SELECT * FROM source_pauses`, (rows) => {
    const paused = new Map(rows.map((r) => [r.source as Source.Source, r]))
    return Source.sources.map((source): Operations.SourceControl => {
      const r = paused.get(source)
      return r
        ? { source, paused: true, pausedAt: Number(r.paused_at), pausedBy: String(r.paused_by), reason: String(r.reason) }
        : { source, paused: false, pausedAt: null, pausedBy: null, reason: null }
    })
  })

  const devices = (where: Statement.Fragment) =>
    Effect.gen(function* () {
      const ds = yield* sql<Row>`
        SELECT d.id, d.name, d.slots, d.created_at, d.revoked_at, d.containment, d.reported_at, s.sources AS only_sources,
          (SELECT CASE WHEN count(*) = 0 THEN NULL ELSE ${greatest(
            "max(a.issued_at)",
            "COALESCE(max(a.last_progress_at), 0)",
            // core's Operations.contactOf: an end counts when the device made it, not the sweep or an operator
            "COALESCE(max(CASE WHEN a.state <> 'expired' AND NOT EXISTS (SELECT 1 FROM cancellations c WHERE c.reservation_id = a.reservation_id) THEN a.ended_at END), 0)"
          )} END
            FROM assignments a WHERE a.device_id = d.id) AS last_contact
        FROM devices d LEFT JOIN device_sources s ON s.device_id = d.id
        WHERE ${where} ORDER BY d.id`
      if (ds.length === 0) return []
      const active = (yield* sql<Row>`
        SELECT ${sql.literal(Codec.assignmentColumns)} FROM assignments WHERE state = 'active' AND device_id ${inIds(ds.map((d) => Number(d.id)))} ORDER BY slot`).map(Codec.assignment)
      return ds.map(
        (d): Operations.DeviceDetail => ({
          ...Codec.device(d),
          sources: d.only_sources === null || d.only_sources === undefined ? null : (JSON.parse(String(d.only_sources)) as Array<Source.Source>),
          lastContactAt: numOrNull(d.last_contact),
          active: active.filter((a) => a.deviceId === Number(d.id))
        })
      )
    })

  const newer = (source: Source.Source) =>
    Source.hasRemoteTimestamp(source) ? sql`(t.observed_remote_at IS NOT NULL AND (t.covered_remote_at IS NULL OR t.observed_remote_at > t.covered_remote_at))` : sql`1 = 0`

  const ops: Operations.OperationsShape = {
    redriveDue: (source, policy, now, limit) =>
      transaction(
        Effect.gen(function* () {
          const n = Math.max(0, Math.floor(limit))
          // Plan the failures not planned yet at their current fence (a bounded batch per pass).
          const unplanned = yield* detailQuery(
            sql`t.source = ${source} AND t.status IN ('failed', 'unresolved') AND (r.planned_fence IS NULL OR r.planned_fence <> t.fence)`,
            sql` ORDER BY t.id LIMIT ${planBatch}`
          )
          // The failure time is when the target's last assignment ended.
          const plans = unplanned.map((r) => {
            const t = detail(r)
            return [t.id, Retry.plan(t, t.redrive, policy, numOrNull(r.last_ended) ?? now)] as const
          })
          yield* saveStates(plans)
          if (n === 0) return { redriven: [], planned: plans.length }
          // Due ones, in core's order; the rule decides again on what was read.
          const due = (yield* detailQuery(
            sql`t.source = ${source} AND t.status IN ('failed', 'unresolved') AND r.planned_fence = t.fence
              AND ((r.retry_at IS NOT NULL AND r.retry_at <= ${now}) OR ${newer(source)})`,
            sql` ORDER BY CASE WHEN ${newer(source)} THEN 0 ELSE r.retry_at END, t.id LIMIT ${n}${isPg ? sql.literal(" FOR UPDATE OF t SKIP LOCKED") : sql.literal("")}`
          ))
            .map(detail)
            .flatMap((t) => {
              const reason = Retry.decide(t, t.redrive, now)
              return reason === null ? [] : [{ t, reason, next: Retry.redrive(t, t.redrive, reason) }]
            })
          if (due.length === 0) return { redriven: [], planned: plans.length }
          const moved = yield* sql<{ id: number }>`
            UPDATE targets SET status = 'pending', fence = fence + 1, attempts = 0
            WHERE status IN ('failed', 'unresolved') AND (id, fence) IN (${pairs(due.map((d) => [d.t.id, d.t.fence] as const))})
            RETURNING id`
          const ok = new Set(moved.map((r) => Number(r.id)))
          const done = due.filter((d) => ok.has(d.t.id))
          yield* saveStates(done.map((d) => [d.t.id, d.next.state] as const))
          return { redriven: done.map((d) => ({ identity: d.t.identity, reason: d.reason })), planned: plans.length }
        })
      ),

    listTargets: (q) => {
      const limit = Math.max(0, Math.floor(q.limit))
      const fs: Array<Statement.Fragment> = [sql`1 = 1`]
      if (q.after !== undefined) fs.push(isId(q.after) ? sql`t.id > ${q.after}` : sql`1 = 0`)
      if (q.source !== undefined) fs.push(sql`t.source = ${q.source}`)
      if (q.status !== undefined) fs.push(sql`t.status = ${q.status}`)
      if (q.identityPrefix !== undefined && q.identityPrefix.length > 0)
        fs.push(sql`substr(t.identity, 1, ${[...q.identityPrefix].length}) = ${q.identityPrefix}`)
      if (q.changedSince !== undefined)
        fs.push(
          sql`${greatest(
            "t.discovered_at",
            "COALESCE(t.last_scan_started_at, 0)",
            "COALESCE(t.completed_at, 0)",
            "COALESCE((SELECT max(a.ended_at) FROM assignments a WHERE a.target_id = t.id), 0)"
          )} >= ${q.changedSince}`
        )
      return mapped(
        Effect.map(detailQuery(sql.and(fs), sql` ORDER BY t.id LIMIT ${limit + 1}`), (rows) => {
          const targets = rows.slice(0, limit).map(detail)
          return { targets, next: rows.length > limit && targets.length > 0 ? targets[targets.length - 1].id : null }
        })
      )
    },

    inspectTarget: (source, identity, limit, view) =>
      mapped(
        Effect.gen(function* () {
          const target = yield* findTarget(source, identity, false)
          const as = (yield* sql<Row>`
            SELECT ${sql.literal(Codec.assignmentColumns)} FROM assignments WHERE target_id = ${target.id} ORDER BY reservation_id DESC LIMIT ${Math.max(0, Math.floor(limit))}`).map(Codec.assignment)
          if (as.length === 0) return { target, assignments: [] }
          const ids = as.map((a) => a.reservationId)
          // Operations.inspected in SQL, so a timeline's older recovered events (up to PhaseModel.maxSeq
          // of them, each with a detail) are never read out: phase events, and the newest `recent`.
          const evs = yield* sql<Row>`
            SELECT e.reservation_id, e.seq, e.kind, e.phase, e.at, ${sql.literal(view.details ? "e.detail" : "NULL AS detail")}, e.accepted_at
            FROM progress_events e JOIN assignments a ON a.reservation_id = e.reservation_id
            WHERE e.reservation_id ${inIds(ids)} AND (e.kind = 'phase' OR e.seq > a.last_seq - ${Math.max(0, Math.floor(view.recent))})
            ORDER BY e.reservation_id, e.seq`
          const cs = yield* sql<Row>`SELECT * FROM cancellations WHERE reservation_id ${inIds(ids)}`
          // grouped in one pass each: an inspection's cost is linear in the rows read
          const timelines = new Map<number, Array<ReturnType<typeof Codec.event>>>()
          for (const r of evs) {
            const id = Number(r.reservation_id)
            const t = timelines.get(id)
            if (t) t.push(Codec.event(r))
            else timelines.set(id, [Codec.event(r)])
          }
          const cancelled = new Map(cs.map((r) => [Number(r.reservation_id), { reservationId: Number(r.reservation_id), at: Number(r.at), who: String(r.who), why: String(r.why) }]))
          return {
            target,
            assignments: as.map((assignment) => {
              const timeline = timelines.get(assignment.reservationId) ?? []
              const last = Math.max(assignment.lastSeq, timeline.length > 0 ? timeline[timeline.length - 1].seq : 0)
              return { assignment, timeline, omittedEvents: Math.max(0, last - timeline.length), cancellation: cancelled.get(assignment.reservationId) ?? null }
            })
          }
        })
      ),

    requeue: (source, identity, actor) =>
      transaction(
        Effect.gen(function* () {
          const t = yield* findTarget(source, identity, true)
          const refused = Operations.requeueRefusal(t)
          if (refused) return yield* refused
          const next = Operations.requeued(t)
          const rows = yield* sql`
            UPDATE targets SET status = 'pending', fence = fence + 1, attempts = 0
            WHERE id = ${t.id} AND status = ${t.status} AND fence = ${t.fence} RETURNING id`
          if (rows.length === 0) return yield* new Errors.StoreError({ reason: "conflict", message: `target ${t.id} changed while being requeued` })
          yield* sql`DELETE FROM target_retries WHERE target_id = ${t.id}`
          yield* record("requeue", Operations.targetSubject(source, identity), { from: t.status }, actor)
          return { ...t, ...next, redrive: Retry.initialState }
        })
      ),

    setPriority: (source, identity, priority, actor) =>
      transaction(
        Effect.gen(function* () {
          const refused = Operations.priorityRefusal(priority)
          if (refused) return yield* refused
          const t = yield* findTarget(source, identity, true)
          // not an authority change: the fence stays, so an assignment in flight keeps its writes
          yield* sql`UPDATE targets SET priority = ${priority} WHERE id = ${t.id}`
          yield* record("set_priority", Operations.targetSubject(source, identity), { from: t.priority, to: priority }, actor)
          return { ...t, priority }
        })
      ),

    cancel: (reservationId, actor) =>
      transaction(
        Effect.gen(function* () {
          if (isId(reservationId)) yield* reservationWriter
          const rows = isId(reservationId) ? yield* sql<Row>`SELECT ${sql.literal(Codec.assignmentColumns)} FROM assignments WHERE reservation_id = ${reservationId}${forUpdate}` : []
          if (rows.length === 0) return yield* new Errors.NotFound({ entity: "assignment", key: String(reservationId) })
          const a = Codec.assignment(rows[0])
          if (a.state !== "active") return yield* new Operations.OperationRefused({ reason: "not_active", message: `reservation ${reservationId} is ${a.state}` })
          const [ended] = yield* endAll([a], actor.now)
          yield* insertCancellations([{ reservationId, at: actor.now, who: actor.who, why: actor.why }])
          yield* record("cancel", `reservation:${reservationId}`, { target: Operations.targetSubject(a.source, a.identity), deviceId: a.deviceId }, actor)
          return ended
        })
      ),

    setPaused: (source, paused, actor) =>
      transaction(
        Effect.gen(function* () {
          if (paused)
            yield* sql`
              INSERT INTO source_pauses (source, paused_at, paused_by, reason) VALUES (${source}, ${actor.now}, ${actor.who}, ${actor.why})
              ON CONFLICT (source) DO UPDATE SET paused_at = excluded.paused_at, paused_by = excluded.paused_by, reason = excluded.reason`
          else yield* sql`DELETE FROM source_pauses WHERE source = ${source}`
          yield* record(paused ? "pause_source" : "resume_source", `source:${source}`, {}, actor)
          return (yield* controls).find((c) => c.source === source)!
        })
      ),

    sourceControls: () => mapped(controls),

    setDeviceSources: (deviceId, only, actor) =>
      transaction(
        Effect.gen(function* () {
          const found = isId(deviceId) ? yield* sql`SELECT id FROM devices WHERE id = ${deviceId}` : []
          if (found.length === 0) return yield* new Errors.NotFound({ entity: "device", key: String(deviceId) })
          if (only === null) yield* sql`DELETE FROM device_sources WHERE device_id = ${deviceId}`
          else
            yield* sql`
              INSERT INTO device_sources (device_id, sources) VALUES (${deviceId}, ${JSON.stringify(Source.sources.filter((s) => only.includes(s)))})
              ON CONFLICT (device_id) DO UPDATE SET sources = excluded.sources`
          yield* record("set_device_sources", `device:${deviceId}`, { sources: only }, actor)
          return (yield* devices(sql`d.id = ${deviceId}`))[0]
        })
      ),

    deviceFilters: () =>
      mapped(
        Effect.map(sql<Row>`SELECT device_id, sources FROM device_sources ORDER BY device_id`, (rows) =>
          rows.map((r) => ({ deviceId: Number(r.device_id), sources: JSON.parse(String(r.sources)) as Array<Source.Source> }))
        )
      ),

    listDevices: () => mapped(devices(sql`1 = 1`)),

    revokeDevice: (deviceId, actor) =>
      transaction(
        Effect.gen(function* () {
          // The device row first (as a transactional claim takes it), then the revocation's own lock:
          // claims in flight commit before the read below, later ones wait and see the revocation.
          const rows = isId(deviceId) ? yield* sql`UPDATE devices SET revoked_at = COALESCE(revoked_at, ${actor.now}) WHERE id = ${deviceId} RETURNING id` : []
          if (rows.length === 0) return yield* new Errors.NotFound({ entity: "device", key: String(deviceId) })
          yield* revocationLock
          const active = (yield* sql<Row>`
            SELECT ${sql.literal(Codec.assignmentColumns)} FROM assignments WHERE device_id = ${deviceId} AND state = 'active' ORDER BY reservation_id${forUpdate}`).map(Codec.assignment)
          const ended = yield* endAll(active, actor.now)
          yield* insertCancellations(ended.map((a) => Operations.revocationOf(a.reservationId, deviceId, actor)))
          yield* record("revoke_device", `device:${deviceId}`, { released: ended.map((a) => a.reservationId) }, actor)
          return ended
        })
      ),

    // One grouped count over the window's ended assignments; core's outcomeOf names each group.
    outcomesOverTime: (from, to, bucketMs) => {
      const buckets = Operations.emptyBuckets(from, to, bucketMs)
      if (buckets.length === 0) return Effect.succeed([])
      const size = Math.max(1, Math.floor(bucketMs))
      const end = from + buckets.length * size
      return mapped(
        Effect.map(
          sql<Row>`
            SELECT (ended_at - ${from}) / ${size} AS b, state, CASE WHEN outcome = 'killed_at_deadline' THEN 1 ELSE 0 END AS killed, count(*) AS n
            FROM assignments WHERE state <> 'active' AND ended_at >= ${from} AND ended_at < ${Math.min(to, end)}
            GROUP BY 1, 2, 3`,
          (rows) => {
            const out = [...buckets]
            for (const r of rows) {
              const i = Math.floor(Number(r.b))
              const k = Operations.bucketOf(r.state as Assignment.State, Number(r.killed) === 1 ? "killed_at_deadline" : null)
              if (k !== null && out[i]) out[i] = { ...out[i], [k]: out[i][k] + Number(r.n) }
            }
            return out
          }
        )
      )
    },

    audit: (action, subject, d, actor) => mapped(record(action, subject, d, actor)),

    listAudit: (q) =>
      mapped(
        Effect.map(
          q.before === undefined
            ? sql<Row>`SELECT * FROM audit_log ORDER BY id DESC LIMIT ${Math.max(0, Math.floor(q.limit))}`
            : sql<Row>`SELECT * FROM audit_log WHERE id < ${isId(q.before) ? q.before : 0} ORDER BY id DESC LIMIT ${Math.max(0, Math.floor(q.limit))}`,
          (rows) => rows.map(auditEntry)
        )
      ),

    cancellation: (reservationId) =>
      mapped(
        Effect.map(isId(reservationId) ? sql<Row>`SELECT * FROM cancellations WHERE reservation_id = ${reservationId}` : Effect.succeed([]), (rows) =>
          rows.length === 0 ? null : { reservationId, at: Number(rows[0].at), who: String(rows[0].who), why: String(rows[0].why) }
        )
      ),

    // One upsert: free, expired or the holder's own lease is granted; the token moves on with each new holder.
    acquireLease: (name, holder, ttlMs, now) =>
      mapped(
        Effect.map(
          sql<Row>`
            INSERT INTO leases (name, holder, token, expires_at) VALUES (${name}, ${holder}, 1, ${now + ttlMs})
            ON CONFLICT (name) DO UPDATE SET
              token = CASE WHEN leases.holder = excluded.holder AND leases.expires_at > ${now} THEN leases.token ELSE leases.token + 1 END,
              holder = excluded.holder, expires_at = excluded.expires_at
            WHERE leases.holder = excluded.holder OR leases.expires_at <= ${now}
            RETURNING name, holder, token, expires_at`,
          (rows) => (rows.length === 0 ? null : { name, holder, token: Number(rows[0].token), expiresAt: Number(rows[0].expires_at) })
        )
      ),

    // The lease row is locked for the promotion: a new holder's takeover waits for it, and a holder
    // whose lease was taken over (or ran out) promotes nothing.
    promoteUnderLease: (lease, source, rule, now) =>
      !Source.hasRemoteTimestamp(source)
        ? Effect.succeed({ promoted: [], deferred: 0 })
        : transaction(
            Effect.gen(function* () {
              const held = yield* sql`
                SELECT token FROM leases WHERE name = ${lease.name} AND holder = ${lease.holder} AND token = ${lease.token} AND expires_at > ${now}${forUpdate}`
              if (held.length === 0) return null
              return yield* (isPg ? Promote.pg(sql, source, rule, now) : Promote.sqlite(sql, source, rule, now))
            })
          ),

    schemaVersion: () => mapped(Effect.map(sql<Row>`SELECT max(migration_id) AS v FROM scanfleet_migrations`, ([r]) => numOrNull(r?.v))),

    releaseLease: (name, holder, token) =>
      mapped(Effect.asVoid(sql`UPDATE leases SET expires_at = 0 WHERE name = ${name} AND holder = ${holder} AND token = ${token}`))
  }
  return ops
})

// Failures planned per redrive pass at most; the next pass plans the rest.
const planBatch = 1000

/** The operator port over the SqlClient in context (run the Store's migrations first, as `PgStore`/`SqliteStore` layers do). */
export const layerFromClient: Layer.Layer<Operations.Operations, never, SqlClient.SqlClient> = Layer.effect(Operations.Operations, make)
