import { SqlClient, type SqlError } from "@effect/sql"
import { Effect, Layer } from "effect"
import { type Assignment, Errors, type Findings, FindingStore, type Store } from "@scanfleet/core"
import { Findings as Rules } from "@scanfleet/core"
import * as Dialect from "./internal/Dialect.js"
import { mapped } from "./internal/SqlErrors.js"

type Row = { readonly [column: string]: unknown }

// The outbox's positions and the findings' ids must become visible in the order they
// are drawn, or a reader that has read past one (an outbox subscriber, a keyset page
// `after` an id) could miss one committed later: on Postgres every transaction that
// writes an outbox row (each one that inserts findings does) takes this
// transaction-scoped lock ("sfout" in ASCII) before it draws either, until it commits.
const OUTBOX_LOCK = 0x73666f7574

const num = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v))
const text = (v: unknown): string | null => (v === null || v === undefined ? null : String(v))

const finding = (r: Row): Findings.Finding => ({
  id: Number(r.id),
  targetId: Number(r.target_id),
  source: r.source as Findings.Finding["source"],
  identity: String(r.identity),
  detector: String(r.detector),
  path: String(r.path),
  line: num(r.line),
  fingerprint: String(r.fingerprint),
  preview: String(r.preview),
  verified: r.verified === null || r.verified === undefined ? null : Boolean(Number(r.verified)),
  status: r.status as Findings.Status,
  firstSeenAt: Number(r.first_seen_at),
  lastSeenAt: Number(r.last_seen_at),
  firstRevision: text(r.first_revision),
  lastRevision: text(r.last_revision),
  resolvedAt: num(r.resolved_at),
  resolvedRevision: text(r.resolved_revision),
  details: JSON.parse(String(r.details)) as Record<string, unknown>,
  sealed: text(r.sealed)
})

const scan = (r: Row): Findings.Scan => ({
  reservationId: Number(r.reservation_id),
  targetId: Number(r.target_id),
  source: r.source as Findings.Scan["source"],
  identity: String(r.identity),
  revision: text(r.revision),
  at: Number(r.at),
  new: Number(r.new_count),
  present: Number(r.present_count),
  resolved: Number(r.resolved_count)
})

const event = (r: Row): Findings.Event => ({
  findingId: Number(r.finding_id),
  reservationId: Number(r.reservation_id),
  kind: r.kind as Findings.Event["kind"],
  revision: text(r.revision),
  at: Number(r.at)
})

const outboxEvent = (r: Row): Findings.OutboxEvent => ({ seq: Number(r.seq), ...(JSON.parse(String(r.payload)) as Omit<Findings.OutboxEvent, "seq">) })

/** What the findings of an accepted result are related under: its reservation and target. */
export const scanOf = (input: Store.ResultInput, a: Assignment.Assignment): FindingStore.ScanInput => ({
  reservationId: a.reservationId,
  targetId: a.targetId,
  source: a.source,
  identity: a.identity,
  coveredRemoteAt: a.coveredRemoteAt,
  outcome: input.outcome,
  now: input.now,
  body: input.body
})

/**
 * Records one accepted result's findings, inside the transaction that accepts
 * the result (the caller's `sql` runs in it): relates them to the target's
 * stored findings with core's `Findings.relate`, writes the plan (a few
 * statements whatever the number of findings), the scan's summary, and one
 * outbox event when anything became new or resolved. Outcomes that do not
 * relate (a failed scan), and scans of a target that had and has no findings,
 * write nothing.
 */
export const record = (sql: SqlClient.SqlClient, input: FindingStore.ScanInput): Effect.Effect<void, SqlError.SqlError> =>
  Effect.gen(function* () {
    if (!Rules.relates(input.outcome)) return
    const isPg = sql.onDialectOrElse({ pg: () => true, orElse: () => false })
    const { inIds } = Dialect.of(sql)
    const each = (v: unknown) =>
      isPg
        ? sql`jsonb_array_elements(${JSON.stringify(v)}::jsonb) WITH ORDINALITY AS j(value, k)`
        : sql`(SELECT value, key AS k FROM json_each(${JSON.stringify(v)})) AS j`
    const field = (name: string, pgType?: string) => sql.literal(isPg && pgType ? `(j.value ->> '${name}')::${pgType}` : `j.value ->> '${name}'`)
    const accepted = Rules.fromBody(input.body)
    const stored = (yield* sql<Row>`SELECT id, detector, path, fingerprint, status FROM findings WHERE target_id = ${input.targetId}`).map((r) => ({
      id: Number(r.id),
      detector: String(r.detector),
      path: String(r.path),
      fingerprint: String(r.fingerprint),
      status: r.status as Findings.Status
    }))
    const plan = Rules.relate(stored, accepted)
    if (Rules.isEmpty(plan)) return
    const revision = Rules.revisionOf(accepted, input.coveredRemoteAt)
    const at = input.now
    const changed = new Map<number, "new" | "resolved">()
    const events: Array<readonly [number, string]> = []
    // A scan that makes something new or resolved writes an outbox event: on Postgres it takes
    // the outbox lock before any write, so the findings' ids drawn below (and its outbox position)
    // become visible in the order they are drawn. The lock comes before the findings' row locks
    // in every transaction that takes it; the target's row lock, taken earlier, keeps one writer
    // per target.
    if (isPg && plan.summary.new + plan.summary.resolved > 0) yield* sql`SELECT pg_advisory_xact_lock(${OUTBOX_LOCK})`
    if (plan.inserts.length > 0) {
      const docs = plan.inserts.map((r) => ({ ...r, details: JSON.stringify(r.details) }))
      const ids = yield* sql<Row>`
        INSERT INTO findings (target_id, source, identity, detector, path, line, fingerprint, preview, verified, status,
          first_seen_at, last_seen_at, first_revision, last_revision, details, sealed)
        SELECT ${input.targetId}, ${input.source}, ${input.identity}, ${field("detector")}, ${field("path")}, ${field("line", "int")}, ${field("fingerprint")},
          ${field("preview")}, ${field("verified", "boolean")}, 'new', ${at}, ${at}, ${revision}, ${revision}, ${field("details")}, ${field("sealed")}
        FROM ${each(docs)} ORDER BY j.k
        RETURNING id`
      for (const r of ids) {
        changed.set(Number(r.id), "new")
        events.push([Number(r.id), "new"])
      }
    }
    if (plan.seen.length > 0) {
      const docs = plan.seen.map((s) => ({ id: s.id, status: s.status, line: s.reported.line, preview: s.reported.preview, verified: s.reported.verified, details: JSON.stringify(s.reported.details), sealed: s.reported.sealed }))
      yield* sql`
        UPDATE findings SET status = u.status, line = u.line, preview = u.preview, verified = u.verified, details = u.details,
          sealed = COALESCE(u.sealed, findings.sealed), last_seen_at = ${at}, last_revision = ${revision}, resolved_at = NULL, resolved_revision = NULL
        FROM (SELECT ${field("id", "bigint")} AS id, ${field("status")} AS status, ${field("line", "int")} AS line, ${field("preview")} AS preview,
          ${field("verified", "boolean")} AS verified, ${field("details")} AS details, ${field("sealed")} AS sealed FROM ${each(docs)}) AS u
        WHERE findings.id = u.id`
      for (const s of plan.seen)
        if (s.reopened) {
          changed.set(s.id, "new")
          events.push([s.id, "reopened"])
        }
    }
    if (plan.resolved.length > 0) {
      yield* sql`UPDATE findings SET status = 'resolved', resolved_at = ${at}, resolved_revision = ${revision} WHERE id ${inIds(plan.resolved)}`
      for (const id of plan.resolved) {
        changed.set(id, "resolved")
        events.push([id, "resolved"])
      }
    }
    if (events.length > 0)
      yield* sql`
        INSERT INTO finding_events (finding_id, reservation_id, kind, revision, at)
        SELECT ${field("0", "bigint")}, ${input.reservationId}, ${field("1")}, ${revision}, ${at} FROM ${each(events.map(([id, kind]) => ({ 0: id, 1: kind })))}`
    const s = plan.summary
    yield* sql`
      INSERT INTO finding_scans (reservation_id, target_id, source, identity, revision, at, new_count, present_count, resolved_count)
      VALUES (${input.reservationId}, ${input.targetId}, ${input.source}, ${input.identity}, ${revision}, ${at}, ${s.new}, ${s.present}, ${s.resolved})`
    if (changed.size === 0) return
    const rows = (yield* sql<Row>`SELECT * FROM findings WHERE id ${inIds([...changed.keys()])} ORDER BY id`).map(finding)
    const payload: Omit<Findings.OutboxEvent, "seq"> = {
      type: "scan.related",
      at,
      scan: { reservationId: input.reservationId, targetId: input.targetId, source: input.source, identity: input.identity, revision, at, ...s },
      findings: rows.map((f) => ({ id: f.id, change: changed.get(f.id)!, detector: f.detector, path: f.path, line: f.line, fingerprint: f.fingerprint, preview: f.preview, verified: f.verified }))
    }
    yield* sql`INSERT INTO finding_outbox (target_id, at, payload) VALUES (${input.targetId}, ${at}, ${JSON.stringify(payload)})`
  })

/**
 * The FindingStore port over an `@effect/sql` client (Postgres or SQLite,
 * migrated by the store's own layer). Every SqlError leaves as a StoreError.
 *
 * @example
 * const findings = yield* SqlFindingStore.make
 */
export const make: Effect.Effect<FindingStore.FindingStoreShape, never, SqlClient.SqlClient> = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const isPg = sql.onDialectOrElse({ pg: () => true, orElse: () => false })
  const { inIds } = Dialect.of(sql)
  return {
    list: (q) =>
      mapped(
        Effect.gen(function* () {
          const limit = Math.max(0, Math.min(10_000, Math.floor(q.limit)))
          if (limit === 0) return { findings: [], next: null }
          const where = [
            sql`id > ${q.after ?? 0}`,
            ...(q.source !== undefined ? [sql`source = ${q.source}`] : []),
            ...(q.identity !== undefined ? [sql`identity = ${q.identity}`] : []),
            ...(q.detector !== undefined ? [sql`detector = ${q.detector}`] : []),
            ...(q.status !== undefined ? [sql`status = ${q.status}`] : []),
            ...(q.verified !== undefined ? [isPg ? sql`verified = ${q.verified}` : sql`verified = ${q.verified ? 1 : 0}`] : []),
            ...(q.since !== undefined ? [sql`last_seen_at >= ${q.since}`] : [])
          ]
          const rows = (yield* sql<Row>`SELECT * FROM findings WHERE ${sql.and(where)} ORDER BY id LIMIT ${limit + 1}`).map(finding)
          const page = rows.slice(0, limit)
          return { findings: page, next: rows.length > limit ? page[page.length - 1].id : null }
        })
      ),
    newest: (limit) =>
      mapped(Effect.map(sql<Row>`SELECT * FROM findings ORDER BY id DESC LIMIT ${Math.max(0, Math.min(10_000, Math.floor(limit)))}`, (rows) => rows.map(finding))),
    // Each status counted through (status, id) up to cap + 1 rows, in one statement.
    countByStatus: (cap) => {
      const n = Math.max(0, Math.floor(cap)) + 1
      return mapped(
        Effect.map(
          sql<Row>`${sql.literal(
            Rules.statuses.map((st) => `SELECT '${st}' AS status, (SELECT count(*) FROM (SELECT 1 FROM findings WHERE status = '${st}' LIMIT ${n}) s) AS n`).join(" UNION ALL ")
          )}`,
          (rows) => Object.fromEntries(Rules.statuses.map((st) => [st, Number(rows.find((r) => r.status === st)?.n ?? 0)])) as Record<Findings.Status, number>
        )
      )
    },
    // One keyset page of each list (findings by (source, identity, id), scans by (target_id,
    // reservation_id)), and the events of the page's findings by their key: a target's size never
    // decides what one call reads.
    forTarget: (q) =>
      mapped(
        Effect.gen(function* () {
          const limit = Math.max(0, Math.min(10_000, Math.floor(q.limit)))
          const parts = FindingStore.targetPageParts(q)
          const notFound = new Errors.NotFound({ entity: "target", key: `${q.source}:${q.identity}` })
          const targets = yield* sql<Row>`SELECT id FROM targets WHERE source = ${q.source} AND identity = ${q.identity}`
          if (targets.length === 0) return yield* Effect.fail(notFound)
          const targetId = Number(targets[0].id)
          const fs = parts.findings
            ? (yield* sql<Row>`
                SELECT * FROM findings WHERE source = ${q.source} AND identity = ${q.identity} AND id > ${q.after ?? 0} ORDER BY id LIMIT ${limit + 1}`).map(finding)
            : []
          const ss = parts.scans
            ? (yield* sql<Row>`SELECT * FROM finding_scans WHERE target_id = ${targetId} AND reservation_id > ${q.scansAfter ?? 0} ORDER BY reservation_id LIMIT ${limit + 1}`).map(scan)
            : []
          if (fs.length === 0 && ss.length === 0) {
            // an empty page: NotFound only when the target has no finding and no related scan at all
            const any = yield* sql<Row>`
              SELECT 1 AS x FROM findings WHERE source = ${q.source} AND identity = ${q.identity}
              UNION ALL SELECT 1 AS x FROM finding_scans WHERE target_id = ${targetId} LIMIT 1`
            if (any.length === 0) return yield* Effect.fail(notFound)
          }
          const findings = fs.slice(0, limit)
          const scans = ss.slice(0, limit)
          // Each finding's newest changes: `cut` is the reservation of the first change left off
          // (null when none is), found by the primary key, so a finding's age never decides the read.
          const rows =
            findings.length === 0
              ? []
              : yield* sql<Row>`
                  WITH cuts AS (
                    SELECT f.id, (SELECT x.reservation_id FROM finding_events x WHERE x.finding_id = f.id ORDER BY x.reservation_id DESC LIMIT 1 OFFSET ${FindingStore.eventsPerFinding}) AS cut
                    FROM findings f WHERE f.id ${inIds(findings.map((f) => f.id))})
                  SELECT e.*, c.cut FROM cuts c JOIN finding_events e ON e.finding_id = c.id AND (c.cut IS NULL OR e.reservation_id > c.cut)
                  ORDER BY e.at, e.reservation_id, e.finding_id`
          const moreEvents = new Set(rows.filter((r) => r.cut !== null).map((r) => Number(r.finding_id)))
          return {
            findings,
            events: rows.map(event),
            moreEvents: findings.map((f) => f.id).filter((id) => moreEvents.has(id)),
            scans,
            next: fs.length > limit && findings.length > 0 ? findings[findings.length - 1].id : null,
            nextScans: ss.length > limit && scans.length > 0 ? scans[scans.length - 1].reservationId : null
          }
        })
      ),
    // A keyset page of one finding's changes by its primary key (finding, reservation).
    history: (q) =>
      mapped(
        Effect.gen(function* () {
          const limit = Math.max(0, Math.min(10_000, Math.floor(q.limit)))
          const notFound = new Errors.NotFound({ entity: "finding", key: String(q.findingId) })
          if (!Number.isSafeInteger(q.findingId)) return yield* Effect.fail(notFound)
          const rows = (yield* sql<Row>`
            SELECT * FROM finding_events WHERE finding_id = ${q.findingId} AND reservation_id > ${q.after ?? 0} ORDER BY reservation_id LIMIT ${limit + 1}`).map(event)
          // every finding has its first change, so only a page past the end asks whether the finding exists
          if (rows.length === 0 && (yield* sql<Row>`SELECT 1 AS x FROM findings WHERE id = ${q.findingId}`).length === 0) return yield* Effect.fail(notFound)
          const events = rows.slice(0, limit)
          return { events, next: rows.length > limit && events.length > 0 ? events[events.length - 1].reservationId : null }
        })
      ),
    scan: (reservationId) =>
      Number.isSafeInteger(reservationId)
        ? mapped(Effect.map(sql<Row>`SELECT * FROM finding_scans WHERE reservation_id = ${reservationId}`, (rows) => (rows.length === 0 ? null : scan(rows[0]))))
        : Effect.succeed(null),
    outbox: (after, limit) =>
      mapped(
        Effect.map(
          sql<Row>`SELECT seq, payload FROM finding_outbox WHERE seq > ${Math.max(0, Math.floor(after))} ORDER BY seq LIMIT ${Math.max(0, Math.min(10_000, Math.floor(limit)))}`,
          (rows) => rows.map(outboxEvent)
        )
      ),
    cursor: (subscriber) => mapped(Effect.map(sql<Row>`SELECT seq FROM finding_cursors WHERE subscriber = ${subscriber}`, (rows) => (rows.length === 0 ? 0 : Number(rows[0].seq)))),
    advance: (subscriber, seq) =>
      mapped(
        Effect.asVoid(
          sql`INSERT INTO finding_cursors (subscriber, seq) VALUES (${subscriber}, ${seq})
            ON CONFLICT (subscriber) DO UPDATE SET seq = ${sql.literal(isPg ? "GREATEST" : "MAX")}(finding_cursors.seq, excluded.seq)`
        )
      ),
    deadLetter: (subscriber, l) =>
      mapped(
        Effect.asVoid(
          sql`INSERT INTO finding_dead_letters (subscriber, seq, attempts, last_error, at) VALUES (${subscriber}, ${l.seq}, ${l.attempts}, ${l.lastError.slice(0, 2000)}, ${l.at})
            ON CONFLICT (subscriber, seq) DO UPDATE SET attempts = excluded.attempts, last_error = excluded.last_error, at = excluded.at`
        )
      ),
    deadLetters: (subscriber) =>
      mapped(
        Effect.map(sql<Row>`SELECT * FROM finding_dead_letters WHERE subscriber = ${subscriber} ORDER BY seq`, (rows) =>
          rows.map((r) => ({ seq: Number(r.seq), attempts: Number(r.attempts), lastError: String(r.last_error), at: Number(r.at) }))
        )
      ),
    takeDeadLetter: (subscriber, seq) =>
      Number.isSafeInteger(seq)
        ? mapped(
            sql.withTransaction(
              Effect.gen(function* () {
                const gone = yield* sql<Row>`DELETE FROM finding_dead_letters WHERE subscriber = ${subscriber} AND seq = ${seq} RETURNING seq`
                if (gone.length === 0) return null
                const rows = yield* sql<Row>`SELECT seq, payload FROM finding_outbox WHERE seq = ${seq}`
                return rows.length === 0 ? null : outboxEvent(rows[0])
              })
            )
          )
        : Effect.succeed(null)
  }
})

/** The FindingStore over the SqlClient in context. */
export const layerFromClient: Layer.Layer<FindingStore.FindingStore, never, SqlClient.SqlClient> = Layer.effect(FindingStore.FindingStore, make)
