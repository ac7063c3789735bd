import { Migrator, SqlClient, type SqlError } from "@effect/sql"
import { SqliteClient } from "@effect/sql-sqlite-node"
import { Assignment, PhaseModel, WorkerApi } from "@scanfleet/core"
import Sqlite from "better-sqlite3"
import { Cause, Context, Data, Deferred, Effect, Either, Exit, Layer, ManagedRuntime } from "effect"
import { existsSync, statSync } from "node:fs"
import { z } from "zod"
import * as Damage from "./internal/Damage.js"
import m0001 from "./internal/migrations/0001_journal.js"
import m0002 from "./internal/migrations/0002_fleet.js"
import m0003 from "./internal/migrations/0003_damaged_rows.js"

/**
 * The device's local state in one SQLite file: slots, the assignments they
 * ran, the phase journal (which doubles as the progress outbox) and the
 * result outbox. The controller writes a row before it acts on it, so a
 * restart finds every unit and every undelivered event.
 *
 * Every assignment belongs to the fleet (database) that issued it, and rows
 * are keyed by (fleet, reservation): reservation ids restart at 1 in another
 * database, so a device pointed at another server never mixes two timelines.
 *
 * Damage costs only what is damaged. A row whose payload does not parse is
 * moved to the `damaged_rows` table when it is read, and the device goes on
 * without it; a file SQLite cannot use at all is found by `inspect` and set
 * aside by `resetIfDamaged`, and the fresh file keeps a record of it.
 */

/** The key of an assignment on a device: the fleet that issued it and its reservation id there. */
export interface Key {
  readonly fleetId: string
  readonly reservationId: number
}

/**
 * The fleet of assignments a state file recorded before fleets had ids. They
 * join the first fleet the device registers with while it knows no other.
 */
export const legacyFleet = "legacy"

/** Where the execution unit of an assignment runs, so a restart can kill it. */
export const RunnerSchema = z
  .object({
    pid: z.number().int().positive(),
    pgid: z.number().int().positive(),
    startTime: z.string().nullable(),
    /** The unit's cgroup (cgroup levels): what a restart reclaims from it counts as the unit's survivors. Absent in records of older versions. */
    cgroup: z.string().nullable().optional()
  })
  .strict()
/** A runner process group. */
export type Runner = z.infer<typeof RunnerSchema>

/** The three deadlines on the device's clock (the server's, shifted by the offset seen at claim). */
export const LocalDeadlinesSchema = z.object({ scan: z.number().int(), upload: z.number().int(), expiry: z.number().int() }).strict()

/** What an assignment is doing locally. */
export const assignmentStatuses = ["running", "delivering", "done"] as const

/** One assignment as the device persists it; parsed with zod on every load. */
export const AssignmentRecordSchema = z
  .object({
    fleetId: WorkerApi.FleetId,
    reservationId: z.number().int().positive(),
    slot: z.number().int().min(0),
    fence: z.number().int(),
    view: WorkerApi.AssignmentViewSchema,
    /** Device clock minus server clock at claim, milliseconds. */
    clockOffsetMs: z.number().int(),
    deadlines: LocalDeadlinesSchema,
    status: z.enum(assignmentStatuses),
    phase: PhaseModel.PhaseSchema.nullable(),
    lastSeq: z.number().int().min(0),
    runner: RunnerSchema.nullable(),
    tmpDir: z.string().nullable(),
    stageFile: z.string().nullable(),
    outcome: Assignment.OutcomeSchema.nullable(),
    finalPhase: PhaseModel.PhaseSchema.nullable(),
    receipt: WorkerApi.Receipt.nullable(),
    note: z.string().nullable()
  })
  .strict()
/** One persisted assignment. */
export type AssignmentRecord = z.infer<typeof AssignmentRecordSchema>

/** One slot: idle, or running the execution unit of an assignment. */
export const SlotStateSchema = z
  .object({
    slot: z.number().int().min(0),
    fleetId: WorkerApi.FleetId.nullable().default(null),
    reservationId: z.number().int().positive().nullable(),
    updatedAt: z.number().int()
  })
  .strict()
/** One slot's state. */
export type SlotState = z.output<typeof SlotStateSchema>

/** Delivery state of one outbox item. `local` events are never sent (after the server closed the reservation). */
export const deliveries = ["pending", "acked", "local", "refused", "abandoned"] as const
/** Delivery state of one outbox item. */
export type Delivery = (typeof deliveries)[number]

/** One journal entry: a phase event and its delivery. */
export interface JournalEntry extends PhaseModel.Event {
  readonly fleetId: string
  readonly reservationId: number
  readonly delivery: Delivery
  readonly ackedAt: number | null
  readonly error: string | null
}

/** The body of a queued result or release. */
export type OutboxBody =
  | { readonly kind: "result"; readonly body: z.infer<typeof WorkerApi.ResultRequest> }
  | { readonly kind: "release"; readonly body: z.infer<typeof WorkerApi.ReleaseRequest> }

/**
 * The last word on a reservation, waiting in the outbox: a result, or a
 * release (the device gives the target back). Sent once every event up to
 * `afterSeq` left the outbox.
 */
export type OutboxResult = Key & {
  readonly afterSeq: number
  readonly delivery: Delivery
  readonly attempts: number
  readonly error: string | null
} & OutboxBody

/** A result or release to queue; `kind` defaults to a result. */
export type NewResult = Key & { readonly afterSeq: number } & (
    | { readonly kind?: "result"; readonly body: z.infer<typeof WorkerApi.ResultRequest> }
    | { readonly kind: "release"; readonly body: z.infer<typeof WorkerApi.ReleaseRequest> }
  )

/** What the journal holds of one fleet. */
export interface FleetSummary {
  readonly fleetId: string
  /** The server the device last reached this fleet through, if it registered with it. */
  readonly server: string | null
  readonly lastSeenAt: number | null
  readonly assignments: number
  readonly open: number
  /** Events and results still to deliver to this fleet. */
  readonly undelivered: number
}

/** A row found damaged and moved to the state file's `damaged_rows` table. */
export interface DamagedRow {
  /** When it was set aside, wall clock, epoch milliseconds. */
  readonly at: number
  readonly table: string
  /** Which row it was, by its key; never its payload, which may hold a secret. */
  readonly key: string
  /** What was wrong with it: each issue's path and code, or that it was not JSON. */
  readonly problem: string
  /** What the device lost with it, and what it does instead. */
  readonly lost: string
}

/** A whole state file SQLite cannot use, as `inspect` finds it. */
export interface FileDamage {
  /** SQLite's code (`SQLITE_NOTADB`, `SQLITE_CORRUPT`...), or `truncated` for a file cut to nothing. */
  readonly code: string
  /** SQLite's words, or what its integrity check found. */
  readonly problem: string
  /** What the device loses with the file, as far as it can still be read. */
  readonly lost: string
}

/** The record a fresh state file keeps of the damaged one it replaced (`resetIfDamaged`). */
export const ResetSchema = z
  .object({
    /** When the damaged file was set aside, wall clock, epoch milliseconds. */
    at: z.number().int(),
    file: z.string(),
    setAsideAs: z.string(),
    code: z.string(),
    problem: z.string(),
    lost: z.string()
  })
  .strict()
/** A reset of the state file. */
export type Reset = z.infer<typeof ResetSchema>

/** The folder beside a state file where execution units stage their results; a controller makes it once the file's schema is written. */
export const stageFolder = (file: string): string => `${file}.stage`

/** What the last controller on this file found and said at start. */
export const ControllerInfoSchema = z
  .object({
    pid: z.number().int(),
    startedAt: z.number().int(),
    server: z.string(),
    /** The containment level in force for its scan stages. */
    containment: z.string(),
    scanner: z.string(),
    slots: z.number().int()
  })
  .strict()
/** What the last controller recorded about itself. */
export type ControllerInfo = z.infer<typeof ControllerInfoSchema>

/** An append the phase model refused; nothing was written. */
export class JournalRefused extends Data.TaggedError("JournalRefused")<{
  readonly reason: PhaseModel.Refusal["reason"]
  readonly seq: number
  readonly message: string
}> {}

/** The state file could not be read or written, is damaged, or a row to write does not parse. */
export class StateError extends Data.TaggedError("StateError")<{
  readonly reason: "io" | "damaged" | "missing"
  readonly message: string
  readonly cause?: unknown
}> {}

/** An appended event. */
export type NewEvent = { readonly kind: "phase" | "recovered"; readonly phase: PhaseModel.Phase; readonly at: number; readonly detail?: string }

/** The local state service: every operation is one statement or one transaction. */
export class State extends Context.Tag("@scanfleet/worker/LocalState")<
  State,
  {
    /** The state file. */
    readonly file: string
    /** Every slot row. */
    readonly slots: Effect.Effect<ReadonlyArray<SlotState>, StateError>
    /** Writes one slot row. */
    readonly putSlot: (s: SlotState) => Effect.Effect<void, StateError>
    /** One assignment, or null. */
    readonly assignment: (key: Key) => Effect.Effect<AssignmentRecord | null, StateError>
    /** Assignments, newest claim first; optionally only those not yet done, or of one fleet. */
    readonly assignments: (q?: { readonly open?: boolean; readonly limit?: number; readonly fleetId?: string }) => Effect.Effect<ReadonlyArray<AssignmentRecord>, StateError>
    /** Writes one assignment row (before the controller acts on it). */
    readonly putAssignment: (a: AssignmentRecord) => Effect.Effect<void, StateError>
    /**
     * Appends the next event of a timeline with core's phase model, updating
     * the assignment's phase and last sequence in the same transaction.
     * `delivery: "local"` keeps it out of the outbox.
     */
    readonly append: (key: Key, e: NewEvent, delivery?: "pending" | "local") => Effect.Effect<PhaseModel.Event, JournalRefused | StateError>
    /** The whole journal of an assignment, in sequence order. */
    readonly journal: (key: Key) => Effect.Effect<ReadonlyArray<JournalEntry>, StateError>
    /** Reservations of one fleet with undelivered events or results, oldest first. */
    readonly outboxReservations: (fleetId: string) => Effect.Effect<ReadonlyArray<Key>, StateError>
    /** Pending events of an assignment in sequence order. */
    readonly pendingEvents: (key: Key, limit: number) => Effect.Effect<ReadonlyArray<JournalEntry>, StateError>
    /** Marks events delivered (or refused, or abandoned). */
    readonly markEvents: (key: Key, seqs: ReadonlyArray<number>, delivery: Delivery, at: number, error?: string) => Effect.Effect<void, StateError>
    /** Queues a result (or a release) after the events up to `afterSeq`; a second one for the same key is ignored. */
    readonly putResult: (r: NewResult) => Effect.Effect<void, StateError>
    /** The queued result of an assignment. */
    readonly result: (key: Key) => Effect.Effect<OutboxResult | null, StateError>
    /** Records a result delivery attempt's outcome. */
    readonly markResult: (key: Key, delivery: Delivery, error?: string) => Effect.Effect<void, StateError>
    /** The newest assignment with this reservation id, whatever its fleet. */
    readonly latest: (reservationId: number) => Effect.Effect<Key | null, StateError>
    /** The fleets the journal holds, most recently seen first. */
    readonly fleets: Effect.Effect<ReadonlyArray<FleetSummary>, StateError>
    /**
     * Records that the device reached `fleetId` through `server`; the first
     * fleet a file meets takes over its `legacy` assignments.
     */
    readonly sawFleet: (fleetId: string, server: string, at: number) => Effect.Effect<void, StateError>
    /** What the current (or last) controller recorded about itself. */
    readonly controller: Effect.Effect<ControllerInfo | null, StateError>
    /** Records the controller's start. */
    readonly putController: (c: ControllerInfo) => Effect.Effect<void, StateError>
    /** The rows set aside as damaged, newest first (at most `limit`), and how many there are. */
    readonly damagedRows: (limit: number) => Effect.Effect<{ readonly total: number; readonly rows: ReadonlyArray<DamagedRow> }, StateError>
    /** The damaged file this one replaced, if it did. */
    readonly reset: Effect.Effect<Reset | null, StateError>
    /** Records the damaged file this one replaced. */
    readonly putReset: (r: Reset) => Effect.Effect<void, StateError>
    /**
     * Waits until SQLite first answers an operation that the file itself is damaged (`SQLITE_CORRUPT`,
     * `SQLITE_NOTADB`), and returns that failure: damage that appeared while the file was open, which
     * no retry mends (the next open sets the file aside).
     */
    readonly fileDamaged: Effect.Effect<StateError>
  }
>() {}

/** The service's shape. */
export type Service = Context.Tag.Service<State>

const EventRow = z.object({
  fleet_id: z.string(),
  reservation_id: z.number(),
  seq: z.number(),
  kind: z.enum(["phase", "recovered"]),
  phase: PhaseModel.PhaseSchema,
  at: z.number(),
  detail: z.string().nullable(),
  delivery: z.enum(deliveries),
  acked_at: z.number().nullable(),
  error: z.string().nullable()
})

const ResultRow = z.object({
  fleet_id: z.string(),
  reservation_id: z.number(),
  after_seq: z.number(),
  body: z.string(),
  delivery: z.enum(deliveries),
  attempts: z.number(),
  error: z.string().nullable(),
  kind: z.enum(["result", "release"])
})

const toEntry = (r: z.infer<typeof EventRow>): JournalEntry => ({
  fleetId: r.fleet_id,
  reservationId: r.reservation_id,
  seq: r.seq,
  kind: r.kind,
  phase: r.phase,
  at: r.at,
  ...(r.detail !== null ? { detail: r.detail } : {}),
  delivery: r.delivery,
  ackedAt: r.acked_at,
  error: r.error
})

/** A queued result or release from its row, or what is wrong with the row. */
const toResult = (row: unknown): Either.Either<OutboxResult, string> =>
  Either.flatMap(Damage.check(ResultRow, row), (r) => {
    const common = { fleetId: r.fleet_id, reservationId: r.reservation_id, afterSeq: r.after_seq, delivery: r.delivery, attempts: r.attempts, error: r.error }
    return r.kind === "release"
      ? Either.map(Damage.decode(WorkerApi.ReleaseRequest, r.body), (body): OutboxResult => ({ ...common, kind: "release", body }))
      : Either.map(Damage.decode(WorkerApi.ResultRequest, r.body), (body): OutboxResult => ({ ...common, kind: "result", body }))
  })

/** The migrations table of a state file (the adapters' Migrator, with the worker's own migrations). */
export const migrationsTable = "scanfleet_worker_migrations"

// Static imports, so a bundle carries its migrations and never reads the file system.
const migrations = { "0001_journal": m0001, "0002_fleet": m0002, "0003_damaged_rows": m0003 }

/** Brings a state file's schema up to date (forward-only, idempotent). */
export const migrate: Effect.Effect<ReadonlyArray<readonly [id: number, name: string]>, StateError, SqlClient.SqlClient> = Migrator.make({})({
  loader: Migrator.fromRecord(migrations),
  table: migrationsTable
}).pipe(Effect.mapError((cause) => new StateError({ reason: "io", message: `the state file could not be migrated: ${cause.message}`, cause })))

// The driver's words ("database or disk is full") are what an operator acts on: they follow the SqlError's.
// SQLite's answer that the file itself is damaged is `damaged`, with its code.
const ioError = (cause: SqlError.SqlError) => {
  const damage = Damage.sqliteDamage(cause)
  return damage !== null
    ? new StateError({ reason: "damaged", message: `the state file is damaged (${damage.code}: ${damage.message})`, cause })
    : new StateError({ reason: "io", message: cause.cause instanceof Error ? `${cause.message}: ${cause.cause.message}` : cause.message, cause })
}
// A value the worker is about to write that does not parse is its own bug: refused, never written.
const parse = <S extends z.ZodType>(schema: S, value: unknown, what: string): Effect.Effect<z.output<S>, StateError> => {
  const r = schema.safeParse(value)
  return r.success ? Effect.succeed(r.data) : Effect.fail(new StateError({ reason: "damaged", message: `${what} is damaged: ${r.error.message}`, cause: r.error }))
}

/** The tables whose rows the device reads back, each with what losing one of its rows costs. */
type Table = "slots" | "assignments" | "events" | "results" | "meta"

/** What replaces a row set aside: what was lost with it, and the rows that stand in for it (none, mostly). */
interface Instead<A> {
  readonly lost: string
  readonly rows: ReadonlyArray<A>
}

/** A raw row, with the rowid it is set aside by. */
type Raw = { readonly row_id: number } & Record<string, unknown>

/** Options of the service. */
export interface Options {
  /** Told of every row set aside as damaged, once it is (the controller logs it as an error). */
  readonly onDamaged?: (row: DamagedRow) => Effect.Effect<void>
}

/** The service over the SqlClient in context (a SQLite one), after migrating the file. */
export const make = (file: string, options: Options = {}): Effect.Effect<Service, StateError, SqlClient.SqlClient> =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // The first failure that says the file is damaged, for whoever waits on `fileDamaged`.
    const damagedFile = yield* Deferred.make<StateError>()
    const io = (cause: SqlError.SqlError) => {
      const e = ioError(cause)
      if (e.reason === "damaged") Deferred.unsafeDone(damagedFile, Exit.succeed(e))
      return e
    }
    const q = <A>(e: Effect.Effect<A, SqlError.SqlError>) => Effect.mapError(e, io)
    const onDamaged = options.onDamaged ?? (() => Effect.void)
    yield* q(sql.unsafe("PRAGMA busy_timeout = 5000"))
    // In WAL mode NORMAL survives a crash of the process (kill -9) without an
    // fsync per commit; only a power cut can lose the newest commits, and the
    // server's assignment expiry already covers a device that vanishes.
    yield* q(sql.unsafe("PRAGMA synchronous = NORMAL"))
    yield* migrate

    /**
     * Moves a damaged row to `damaged_rows`, with what its loss changes in other rows (`instead`)
     * in the same transaction, and says so; the reader goes on with the rows that stand in for it.
     * A row rewritten since it was read (a controller writes its slots and its record without reading
     * them first, while `status` may be reading) is left alone: the reader goes on without it this time.
     */
    const setAside = <A>(table: Table, raw: Raw, key: string, problem: string, instead: Effect.Effect<Instead<A>, SqlError.SqlError>) =>
      Effect.gen(function* () {
        const at = Date.now()
        const { row_id, ...row } = raw
        const done = yield* q(
          sql.withTransaction(
            Effect.gen(function* () {
              const [now] = yield* sql<Record<string, unknown>>`SELECT * FROM ${sql(table)} WHERE rowid = ${row_id}`
              // Compared as JSON, so a BLOB (a Buffer each time it is read) compares by its bytes.
              if (now === undefined || Object.entries(row).some(([column, value]) => JSON.stringify(now[column]) !== JSON.stringify(value))) return null
              yield* sql`DELETE FROM ${sql(table)} WHERE rowid = ${row_id}`
              const then = yield* instead
              yield* sql`INSERT INTO damaged_rows (at, table_name, row_key, problem, lost, row) VALUES (${at}, ${table}, ${key}, ${problem}, ${then.lost}, ${JSON.stringify(row)})`
              return then
            })
          )
        )
        if (done === null) return []
        yield* onDamaged({ at, table, key, problem, lost: done.lost })
        return done.rows
      })
    /** The rows that decode, in order; each that does not is set aside, and what stands in for it takes its place. */
    const kept = <A>(
      table: Table,
      rows: ReadonlyArray<Raw>,
      decode: (r: Raw) => Either.Either<A, string>,
      key: (r: Raw) => string,
      instead: (r: Raw, problem: string) => Effect.Effect<Instead<A>, SqlError.SqlError>
    ): Effect.Effect<ReadonlyArray<A>, StateError> =>
      Effect.map(
        Effect.forEach(rows, (r) => Either.match(decode(r), { onRight: (a) => Effect.succeed([a]), onLeft: (problem) => setAside(table, r, key(r), problem, instead(r, problem)) })),
        (xs) => xs.flat()
      )
    const select = (statement: Effect.Effect<ReadonlyArray<object>, SqlError.SqlError>) => q(statement) as Effect.Effect<ReadonlyArray<Raw>, StateError>
    const keyOf = (r: Raw) => `fleet ${String(r.fleet_id)}, reservation ${String(r.reservation_id)}`
    const nothingElse = <A>(lost: string): Effect.Effect<Instead<A>> => Effect.succeed({ lost, rows: [] })

    const slotRows = (rows: ReadonlyArray<Raw>) =>
      kept("slots", rows, (r) => Damage.decode(SlotStateSchema, r.doc), (r) => `slot ${String(r.slot)}`, () => nothingElse<SlotState>("the slot starts idle; an assignment it ran is recovered from its own record"))

    // Without its record the device knows neither the fence nor the deadlines: it can deliver or release nothing of it.
    const assignmentRows = (rows: ReadonlyArray<Raw>) =>
      kept("assignments", rows, (r) => Damage.decode(AssignmentRecordSchema, r.doc), keyOf, (r) => {
        const why = "the assignment's record was damaged and set aside"
        return Effect.as(
          Effect.all([
            sql`UPDATE events SET delivery = 'abandoned', error = ${why} WHERE fleet_id = ${r.fleet_id} AND reservation_id = ${r.reservation_id} AND delivery = 'pending'`,
            sql`UPDATE results SET delivery = 'abandoned', error = ${why} WHERE fleet_id = ${r.fleet_id} AND reservation_id = ${r.reservation_id} AND delivery = 'pending'`
          ]),
          {
            lost:
              "the device no longer knows this reservation: it delivers nothing of it (its undelivered events and result are marked abandoned); " +
              "it is released when its slot next claims and the server names it (slot_busy), so its target goes back to the queue",
            rows: [] as ReadonlyArray<AssignmentRecord>
          }
        )
      })

    /**
     * An event that stands in for a damaged one at its sequence, so the timeline has no gap (the server
     * refuses every event after a gap). Its phase is the damaged event's where the other rows say it
     * (a `recovered` event after it names it; the record keeps the last event's), else the phase before
     * it; it is a `recovered` event when that phase does not change, and `assigned` at sequence 1. It
     * keeps the damaged row's delivery when that is readable, so what the server has is not sent again.
     */
    const standIn = (r: Raw, problem: string): Effect.Effect<Instead<JournalEntry>, SqlError.SqlError> =>
      Effect.gen(function* () {
        const seq = r.seq
        if (typeof seq !== "number" || !Number.isSafeInteger(seq) || seq < 1) return { lost: "its sequence number cannot be read, so nothing stands in for it", rows: [] }
        const near = yield* sql`SELECT * FROM events WHERE fleet_id = ${r.fleet_id} AND reservation_id = ${r.reservation_id} AND seq IN (${seq - 1}, ${seq + 1})`
        const event = (n: number) => Either.getOrNull(Damage.check(EventRow, near.find((e) => e.seq === n)))
        const [before, after] = [event(seq - 1), event(seq + 1)]
        const [record] = yield* sql<{ phase: unknown; last_seq: unknown }>`
          SELECT CASE WHEN json_valid(doc) THEN json_extract(doc, '$.phase') END AS phase, CASE WHEN json_valid(doc) THEN json_extract(doc, '$.lastSeq') END AS last_seq
          FROM assignments WHERE fleet_id = ${r.fleet_id} AND reservation_id = ${r.reservation_id}`
        const recorded = record?.last_seq === seq ? Either.getOrNull(Damage.check(PhaseModel.PhaseSchema, record.phase)) : null
        const phase = after?.kind === "recovered" ? after.phase : (recorded ?? before?.phase)
        const stands =
          seq === 1
            ? ({ kind: "phase", phase: "assigned" } as const)
            : before === null || phase === undefined
              ? null
              : phase !== before.phase
                ? PhaseModel.canTransition(before.phase, phase)
                  ? ({ kind: "phase", phase } as const)
                  : null
                : !PhaseModel.isTerminal(phase) && seq <= PhaseModel.lastRecoverySeq
                  ? ({ kind: "recovered", phase } as const)
                  : null
        if (stands === null) return { lost: "nothing can stand in for it, so its sequence number stays empty and the server refuses this reservation's later events", rows: [] }
        const entry = toEntry({
          fleet_id: String(r.fleet_id),
          reservation_id: Number(r.reservation_id),
          seq,
          ...stands,
          at: typeof r.at === "number" && Number.isSafeInteger(r.at) && r.at >= 0 ? r.at : (before?.at ?? 0),
          detail: `this device's record of event ${seq} was damaged and set aside (${problem}); this event stands in for it`.slice(0, 1000),
          delivery: (deliveries as ReadonlyArray<unknown>).includes(r.delivery) ? (r.delivery as Delivery) : "pending",
          acked_at: typeof r.acked_at === "number" ? r.acked_at : null,
          error: null
        })
        yield* sql`INSERT INTO events (fleet_id, reservation_id, seq, kind, phase, at, detail, delivery, acked_at)
                   VALUES (${r.fleet_id}, ${r.reservation_id}, ${seq}, ${entry.kind}, ${entry.phase}, ${entry.at}, ${entry.detail ?? null}, ${entry.delivery}, ${entry.ackedAt})`
        return { lost: `a ${entry.kind} event in phase ${entry.phase} stands in for it (${entry.delivery}), so the timeline stays whole`, rows: [entry] }
      })
    const eventRows = (rows: ReadonlyArray<Raw>) => kept("events", rows, (r) => Either.map(Damage.check(EventRow, r), toEntry), (r) => `${keyOf(r)}, sequence ${String(r.seq)}`, standIn)

    // Recovery finds an open assignment without its queued result and queues it again.
    const resultRows = (rows: ReadonlyArray<Raw>) =>
      kept("results", rows, toResult, keyOf, (r) =>
        Effect.map(
          sql<{ status: string }>`SELECT status FROM assignments WHERE fleet_id = ${r.fleet_id} AND reservation_id = ${r.reservation_id}`,
          (a): Instead<OutboxResult> => ({
            lost:
              a[0]?.status === "done"
                ? "its assignment had ended, so nothing more is lost"
                : "the assignment's result is queued again (at once by a running device, else at the next start): the scan's own if its staged result is still there, otherwise a scan error",
            rows: []
          })
        )
      )

    const metaRow = <S extends z.ZodType>(key: string, schema: S, lost: string) =>
      Effect.map(
        Effect.flatMap(select(sql`SELECT rowid AS row_id, key, value FROM meta WHERE key = ${key}`), (rows) =>
          kept("meta", rows, (r) => Damage.decode(schema, r.value), (r) => String(r.key), () => nothingElse<z.output<S>>(lost))
        ),
        (rows) => rows[0] ?? null
      )
    const putMeta = (key: string, value: unknown) =>
      Effect.asVoid(q(sql`INSERT INTO meta (key, value) VALUES (${key}, ${JSON.stringify(value)}) ON CONFLICT (key) DO UPDATE SET value = excluded.value`))

    const loadAssignment = (k: Key) =>
      Effect.map(
        Effect.flatMap(select(sql`SELECT rowid AS row_id, fleet_id, reservation_id, doc FROM assignments WHERE fleet_id = ${k.fleetId} AND reservation_id = ${k.reservationId}`), assignmentRows),
        (rows) => rows[0] ?? null
      )
    const saveAssignment = (a: AssignmentRecord) =>
      Effect.flatMap(parse(AssignmentRecordSchema, a, `assignment ${a.reservationId}`), (checked) =>
        q(sql`INSERT INTO assignments (fleet_id, reservation_id, doc, status) VALUES (${a.fleetId}, ${a.reservationId}, ${JSON.stringify(checked)}, ${a.status})
              ON CONFLICT (fleet_id, reservation_id) DO UPDATE SET doc = excluded.doc, status = excluded.status`)
      )
    const loadJournal = (k: Key) =>
      Effect.flatMap(select(sql`SELECT rowid AS row_id, * FROM events WHERE fleet_id = ${k.fleetId} AND reservation_id = ${k.reservationId} ORDER BY seq`), eventRows)

    const service: Service = {
      file,
      slots: Effect.flatMap(select(sql`SELECT rowid AS row_id, slot, doc FROM slots ORDER BY slot`), slotRows),
      putSlot: (s) =>
        Effect.flatMap(parse(SlotStateSchema, s, `slot ${s.slot}`), (checked) =>
          Effect.asVoid(q(sql`INSERT INTO slots (slot, doc) VALUES (${s.slot}, ${JSON.stringify(checked)}) ON CONFLICT (slot) DO UPDATE SET doc = excluded.doc`))
        ),
      assignment: loadAssignment,
      assignments: (o) => {
        const fleet = o?.fleetId !== undefined ? sql`fleet_id = ${o.fleetId}` : sql`1 = 1`
        const open = o?.open ? sql`status <> 'done'` : sql`1 = 1`
        return Effect.flatMap(
          select(sql`SELECT rowid AS row_id, fleet_id, reservation_id, doc FROM assignments WHERE ${open} AND ${fleet} ORDER BY n DESC LIMIT ${o?.limit ?? (o?.open ? 100_000 : 1000)}`),
          assignmentRows
        )
      },
      putAssignment: (a) => Effect.asVoid(saveAssignment(a)),
      append: (k, e, delivery = "pending") =>
        Effect.mapError(
          sql.withTransaction(
            Effect.gen(function* () {
              const a = yield* loadAssignment(k)
              if (a === null) return yield* new StateError({ reason: "missing", message: `no assignment ${k.reservationId} of fleet ${k.fleetId} in the local state` })
              const journal = yield* loadJournal(k)
              // A sequence is never used twice: where a damaged event could not be stood in for, the record's count goes on.
              const last = journal.at(-1)
              const at = last === undefined || last.seq < a.lastSeq ? { phase: a.phase, lastSeq: a.lastSeq } : { phase: last.phase, lastSeq: last.seq }
              const event: PhaseModel.Event = {
                seq: at.lastSeq + 1,
                kind: e.kind,
                phase: e.phase,
                at: e.at,
                ...(e.detail !== undefined ? { detail: e.detail.slice(0, 1000) } : {})
              }
              const checked = PhaseModel.append({ events: journal, ...at }, event)
              if (checked._tag === "Left") return yield* new JournalRefused({ ...checked.left })
              yield* q(sql`INSERT INTO events (fleet_id, reservation_id, seq, kind, phase, at, detail, delivery)
                           VALUES (${k.fleetId}, ${k.reservationId}, ${event.seq}, ${event.kind}, ${event.phase}, ${event.at}, ${event.detail ?? null}, ${delivery})`)
              yield* saveAssignment({ ...a, phase: event.phase, lastSeq: event.seq })
              return event
            })
          ),
          (e) => (e._tag === "SqlError" ? io(e) : e)
        ),
      journal: loadJournal,
      outboxReservations: (fleetId) =>
        Effect.map(
          q(sql<{ id: number }>`SELECT reservation_id AS id FROM events WHERE delivery = 'pending' AND fleet_id = ${fleetId}
                                UNION SELECT reservation_id AS id FROM results WHERE delivery = 'pending' AND fleet_id = ${fleetId} ORDER BY id`),
          (rows) => rows.map((r) => ({ fleetId, reservationId: r.id }))
        ),
      // Through the whole journal, so a damaged event is stood in for by the event before it.
      pendingEvents: (k, limit) => Effect.map(loadJournal(k), (events) => events.filter((e) => e.delivery === "pending").slice(0, limit)),
      markEvents: (k, seqs, delivery, at, error) =>
        seqs.length === 0
          ? Effect.void
          : Effect.asVoid(
              q(sql`UPDATE events SET delivery = ${delivery}, acked_at = ${at}, error = ${error ?? null}
                    WHERE fleet_id = ${k.fleetId} AND reservation_id = ${k.reservationId} AND ${sql.in("seq", seqs)}`)
            ),
      putResult: (r) =>
        Effect.flatMap(
          r.kind === "release" ? parse(WorkerApi.ReleaseRequest, r.body, "a release") : parse(WorkerApi.ResultRequest, r.body, "a result"),
          (body) =>
            Effect.asVoid(
              q(sql`INSERT INTO results (fleet_id, reservation_id, after_seq, body, delivery, kind)
                    VALUES (${r.fleetId}, ${r.reservationId}, ${r.afterSeq}, ${JSON.stringify(body)}, 'pending', ${r.kind ?? "result"})
                    ON CONFLICT (fleet_id, reservation_id) DO NOTHING`)
            )
        ),
      result: (k) =>
        Effect.map(
          Effect.flatMap(select(sql`SELECT rowid AS row_id, * FROM results WHERE fleet_id = ${k.fleetId} AND reservation_id = ${k.reservationId}`), resultRows),
          (rows) => rows[0] ?? null
        ),
      markResult: (k, delivery, error) =>
        Effect.asVoid(
          q(sql`UPDATE results SET delivery = ${delivery}, attempts = attempts + 1, error = ${error ?? null}
                WHERE fleet_id = ${k.fleetId} AND reservation_id = ${k.reservationId}`)
        ),
      latest: (reservationId) =>
        Effect.map(
          q(sql<{ fleet_id: string }>`SELECT fleet_id FROM assignments WHERE reservation_id = ${reservationId} ORDER BY n DESC LIMIT 1`),
          (rows) => (rows.length === 0 ? null : { fleetId: rows[0].fleet_id, reservationId })
        ),
      fleets: Effect.map(
        q(sql<{ fleet_id: string; server: string | null; last_seen: number | null; total: number; open: number; undelivered: number }>`
          SELECT f.fleet_id, s.server, s.last_seen,
                 (SELECT COUNT(*) FROM assignments a WHERE a.fleet_id = f.fleet_id) AS total,
                 (SELECT COUNT(*) FROM assignments a WHERE a.fleet_id = f.fleet_id AND a.status <> 'done') AS open,
                 (SELECT COUNT(*) FROM events e WHERE e.fleet_id = f.fleet_id AND e.delivery = 'pending')
                   + (SELECT COUNT(*) FROM results r WHERE r.fleet_id = f.fleet_id AND r.delivery = 'pending') AS undelivered
          FROM (SELECT fleet_id FROM assignments UNION SELECT fleet_id FROM fleets) f
          LEFT JOIN fleets s ON s.fleet_id = f.fleet_id
          ORDER BY COALESCE(s.last_seen, 0) DESC, f.fleet_id`),
        (rows) =>
          rows.map((r) => ({ fleetId: r.fleet_id, server: r.server, lastSeenAt: r.last_seen, assignments: r.total, open: r.open, undelivered: r.undelivered }))
      ),
      sawFleet: (fleetId, server, at) =>
        Effect.mapError(
          sql.withTransaction(
            Effect.gen(function* () {
              const known = yield* sql<{ n: number }>`SELECT COUNT(*) AS n FROM fleets WHERE fleet_id <> ${fleetId}`
              const others = yield* sql<{ n: number }>`SELECT COUNT(*) AS n FROM assignments WHERE fleet_id NOT IN (${legacyFleet}, ${fleetId})`
              if (known[0].n === 0 && others[0].n === 0) {
                // Before fleet ids, a file only ever spoke to one fleet: the first one it meets now. A doc that is
                // not JSON is moved as it is (SQLite's JSON functions refuse it), and set aside when it is read.
                yield* sql`UPDATE assignments SET fleet_id = ${fleetId},
                             doc = CASE WHEN json_valid(doc) THEN json_set(doc, '$.fleetId', ${fleetId}, '$.view.fleetId', ${fleetId}) ELSE doc END
                           WHERE fleet_id = ${legacyFleet}`
                yield* sql`UPDATE events SET fleet_id = ${fleetId} WHERE fleet_id = ${legacyFleet}`
                yield* sql`UPDATE results SET fleet_id = ${fleetId} WHERE fleet_id = ${legacyFleet}`
                yield* sql`UPDATE slots SET doc = json_set(doc, '$.fleetId', ${fleetId}) WHERE (CASE WHEN json_valid(doc) THEN json_extract(doc, '$.fleetId') END) = ${legacyFleet}`
              }
              yield* sql`INSERT INTO fleets (fleet_id, server, first_seen, last_seen) VALUES (${fleetId}, ${server}, ${at}, ${at})
                         ON CONFLICT (fleet_id) DO UPDATE SET server = excluded.server, last_seen = excluded.last_seen`
            })
          ),
          io
        ),
      controller: metaRow("controller", ControllerInfoSchema, "it is written again when a controller starts"),
      putController: (c) => Effect.flatMap(parse(ControllerInfoSchema, c, "the controller record"), (checked) => putMeta("controller", checked)),
      damagedRows: (limit) =>
        Effect.gen(function* () {
          const [{ n }] = yield* q(sql<{ n: number }>`SELECT COUNT(*) AS n FROM damaged_rows`)
          const rows = yield* q(
            sql<{ at: number; table_name: string; row_key: string; problem: string; lost: string }>`SELECT at, table_name, row_key, problem, lost FROM damaged_rows ORDER BY n DESC LIMIT ${limit}`
          )
          return { total: n, rows: rows.map((r) => ({ at: r.at, table: r.table_name, key: r.row_key, problem: r.problem, lost: r.lost })) }
        }),
      reset: metaRow("reset", ResetSchema, "the record of an earlier reset of the state file is lost"),
      putReset: (r) => Effect.flatMap(parse(ResetSchema, r, "the reset record"), (checked) => putMeta("reset", checked)),
      fileDamaged: Deferred.await(damagedFile)
    }
    return service
  })

const unreadable =
  "what it held cannot be read: a reservation it held is released when its slot next claims and the server names it (slot_busy), " +
  "and the events and results it had not delivered are lost"

/** What a damaged file SQLite can still open held, as far as it can be read. */
const lostIn = (db: Sqlite.Database): string => {
  try {
    const open = db.prepare("SELECT fleet_id, reservation_id FROM assignments WHERE status <> 'done' ORDER BY n").all() as Array<{ fleet_id: string; reservation_id: number }>
    const { n } = db.prepare("SELECT (SELECT COUNT(*) FROM events WHERE delivery = 'pending') + (SELECT COUNT(*) FROM results WHERE delivery = 'pending') AS n").get() as { n: number }
    const held =
      open.length === 0
        ? "it held no open reservation"
        : `${open.length} reservation(s) it held (${open.slice(0, 20).map((a) => `${a.reservation_id} of fleet ${a.fleet_id}`).join(", ")}${open.length > 20 ? ", ..." : ""}) ` +
          "are released when their slots next claim and the server names them (slot_busy)"
    return `${held}; ${n} event(s) and result(s) it had not delivered are lost`
  } catch {
    // The damage reaches the tables themselves.
    return unreadable
  }
}

/**
 * What is wrong with a whole state file, or null when SQLite can use it or
 * there is none yet: SQLite's refusal (`SQLITE_NOTADB`, `SQLITE_CORRUPT`), a
 * failed integrity check, or a file cut to nothing after a controller ran on
 * it. Any other failure to read it (permissions, I/O) is `io`, not damage.
 */
export const inspect = (file: string): Effect.Effect<FileDamage | null, StateError> =>
  Effect.try({
    try: (): FileDamage | null => {
      const size = statSync(file, { throwIfNoEntry: false })?.size
      if (size === undefined) return null
      // A controller writes the schema before it makes the stage folder: empty beside one, the file was cut.
      if (size === 0)
        return existsSync(stageFolder(file)) ? { code: "truncated", problem: "the file is empty (truncated to 0 bytes), though a controller ran on it before", lost: unreadable } : null
      let db: Sqlite.Database | undefined
      try {
        db = new Sqlite(file, { fileMustExist: true })
        const found = (db.pragma("quick_check(5)") as Array<{ quick_check: string }>).map((r) => r.quick_check)
        if (found.length === 1 && found[0] === "ok") return null
        return { code: "SQLITE_CORRUPT", problem: `its integrity check failed: ${found.join("; ").replace(/\s+/g, " ").slice(0, 300)}`, lost: lostIn(db) }
      } catch (e) {
        const damage = Damage.sqliteDamage(e)
        if (damage === null) throw e
        return { code: damage.code, problem: damage.message, lost: unreadable }
      } finally {
        db?.close()
      }
    },
    catch: (cause) => new StateError({ reason: "io", message: `cannot open ${file}: ${String(cause)}`, cause })
  })

/**
 * Sets a damaged state file aside (with its `-wal` and `-shm`, which belong to
 * it), as `FILE.damaged-<ISO time>`, so a fresh one starts in its place;
 * null, and nothing moved, when it is not damaged. Only the controller, which
 * holds the file's lock, may call it.
 */
export const resetIfDamaged = (file: string): Effect.Effect<Reset | null, StateError> =>
  Effect.flatMap(inspect(file), (damage) =>
    damage === null
      ? Effect.succeed(null)
      : Effect.try({
          try: () => {
            const at = new Date()
            return { at: at.getTime(), file, setAsideAs: Damage.setAside(file, at, ["-wal", "-shm", "-journal"]), ...damage }
          },
          catch: (cause) => new StateError({ reason: "io", message: `the state file ${file} is damaged (${damage.code}: ${damage.problem}) and could not be set aside: ${String(cause)}`, cause })
        })
  )

/**
 * The service on its own SQLite connection to `file` (created if missing).
 *
 * @example
 * const StateLive = LocalState.layer("./worker.db")
 */
export const layer = (file: string, options: Options = {}): Layer.Layer<State, StateError> =>
  Layer.effect(State, make(file, options)).pipe(
    Layer.provide(Layer.mapError(SqliteClient.layer({ filename: file }), (cause) => new StateError({ reason: "io", message: `cannot open ${file}: ${String(cause)}`, cause })))
  )

/** An assignment named by its key, or by a bare reservation id (the newest assignment with it, whatever its fleet). */
export type KeyOrId = Key | number

/**
 * The local state as Promises (what `open` returns), for tools and tests that do not use Effect.
 * Methods that name an assignment take its key, or a bare reservation id.
 */
export interface LocalState {
  readonly file: string
  readonly slots: () => Promise<ReadonlyArray<SlotState>>
  readonly putSlot: (s: z.input<typeof SlotStateSchema>) => Promise<void>
  readonly assignment: (k: KeyOrId) => Promise<AssignmentRecord | null>
  readonly assignments: (q?: { readonly open?: boolean; readonly limit?: number; readonly fleetId?: string }) => Promise<ReadonlyArray<AssignmentRecord>>
  readonly putAssignment: (a: AssignmentRecord) => Promise<void>
  readonly append: (k: KeyOrId, e: NewEvent, delivery?: "pending" | "local") => Promise<PhaseModel.Event>
  readonly journal: (k: KeyOrId) => Promise<ReadonlyArray<JournalEntry>>
  readonly result: (k: KeyOrId) => Promise<OutboxResult | null>
  /** Reservations with undelivered items, of one fleet or of every fleet. */
  readonly outboxReservations: (fleetId?: string) => Promise<ReadonlyArray<Key>>
  readonly fleets: () => Promise<ReadonlyArray<FleetSummary>>
  readonly controller: () => Promise<ControllerInfo | null>
  readonly damagedRows: (limit: number) => Promise<{ readonly total: number; readonly rows: ReadonlyArray<DamagedRow> }>
  readonly reset: () => Promise<Reset | null>
  /** Closes the file. */
  readonly close: () => Promise<void>
}

/** The Promise handle over a service run by `run`. */
export const handle = (s: Service, run: <A, E>(e: Effect.Effect<A, E>) => Promise<A>, close: () => Promise<void>): LocalState => {
  const key = (k: KeyOrId): Effect.Effect<Key | null, StateError> => (typeof k === "number" ? s.latest(k) : Effect.succeed(k))
  const keyed = <A>(k: KeyOrId, f: (k: Key) => Effect.Effect<A, unknown>, none: A) => run(Effect.flatMap(key(k), (found) => (found === null ? Effect.succeed(none) : f(found))))
  return {
    file: s.file,
    slots: () => run(s.slots),
    putSlot: (slot) => run(s.putSlot(SlotStateSchema.parse(slot))),
    assignment: (k) => keyed(k, s.assignment, null),
    assignments: (q) => run(s.assignments(q)),
    putAssignment: (a) => run(s.putAssignment(a)),
    append: (k, e, delivery) =>
      run(
        Effect.flatMap(key(k), (found) =>
          found === null ? Effect.fail(new StateError({ reason: "missing", message: `no assignment ${String(k)} in the local state` })) : s.append(found, e, delivery)
        )
      ),
    journal: (k) => keyed(k, s.journal, [] as ReadonlyArray<JournalEntry>),
    result: (k) => keyed(k, s.result, null),
    outboxReservations: (fleetId) =>
      run(
        fleetId !== undefined
          ? s.outboxReservations(fleetId)
          : Effect.flatMap(s.fleets, (fs) => Effect.map(Effect.forEach(fs, (f) => s.outboxReservations(f.fleetId)), (ks) => ks.flat()))
      ),
    fleets: () => run(s.fleets),
    controller: () => run(s.controller),
    damagedRows: (limit) => run(s.damagedRows(limit)),
    reset: () => run(s.reset),
    close
  }
}

/**
 * Opens (and migrates) the state file as Promises. A damaged file is refused
 * (a `StateError` with reason `damaged`), left for the controller to set aside.
 *
 * @example
 * const state = await LocalState.open("./worker.db")
 * console.log(await state.fleets())
 * await state.close()
 */
export const open = async (file: string): Promise<LocalState> => {
  const damage = await Effect.runPromise(Effect.either(inspect(file)))
  if (damage._tag === "Left") throw damage.left
  if (damage.right !== null)
    throw new StateError({
      reason: "damaged",
      message: `the state file ${file} is damaged (${damage.right.code}: ${damage.right.problem}); the next 'scanfleet-worker run' on it sets it aside and starts afresh`
    })
  const rt = ManagedRuntime.make(layer(file))
  // Failures surface as themselves (a JournalRefused, a StateError), not wrapped in a fiber failure.
  const run = async <A, E>(e: Effect.Effect<A, E, State>): Promise<A> => {
    const exit = await rt.runPromiseExit(e)
    if (Exit.isSuccess(exit)) return exit.value
    throw Cause.squash(exit.cause)
  }
  const s = await run(State).catch(async (e) => {
    await rt.dispose()
    throw e
  })
  return handle(s, run, () => rt.dispose())
}
