import { Migrator, SqlClient, type SqlError } from "@effect/sql"
import { SqliteClient } from "@effect/sql-sqlite-node"
import { Assignment, PhaseModel, WorkerApi } from "@scanfleet/core"
import { Cause, Context, Data, Effect, Exit, Layer, ManagedRuntime } from "effect"
import { z } from "zod"
import m0001 from "./internal/migrations/0001_journal.js"
import m0002 from "./internal/migrations/0002_fleet.js"

/**
 * The device's local state in one SQLite file: slots, the assignments they
 * ran, the phase journal (which doubles as the progress outbox) and the
 * result outbox. The controller writes a row before it acts on it, so a
 * restart finds every unit and every undelivered event.
 *
 * Every assignment belongs to the fleet (database) that issued it, and rows
 * are keyed by (fleet, reservation): reservation ids restart at 1 in another
 * database, so a device pointed at another server never mixes two timelines.
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

/** The state file could not be read or written, or holds a row that does not parse. */
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

/** The migrations table of a state file (the adapters' Migrator, with the worker's own migrations). */
export const migrationsTable = "scanfleet_worker_migrations"

// Static imports, so a bundle carries its migrations and never reads the file system.
const migrations = { "0001_journal": m0001, "0002_fleet": m0002 }

/** Brings a state file's schema up to date (forward-only, idempotent). */
export const migrate: Effect.Effect<ReadonlyArray<readonly [id: number, name: string]>, StateError, SqlClient.SqlClient> = Migrator.make({})({
  loader: Migrator.fromRecord(migrations),
  table: migrationsTable
}).pipe(Effect.mapError((cause) => new StateError({ reason: "io", message: `the state file could not be migrated: ${cause.message}`, cause })))

// The driver's words ("database or disk is full") are what an operator acts on: they follow the SqlError's.
const io = (cause: SqlError.SqlError) =>
  new StateError({ reason: "io", message: cause.cause instanceof Error ? `${cause.message}: ${cause.cause.message}` : cause.message, cause })
// A row that does not parse was damaged outside the worker: say which, never guess.
const parse = <S extends z.ZodType>(schema: S, value: unknown, what: string): Effect.Effect<z.output<S>, StateError> => {
  const r = schema.safeParse(value)
  return r.success ? Effect.succeed(r.data) : Effect.fail(new StateError({ reason: "damaged", message: `${what} is damaged: ${r.error.message}`, cause: r.error }))
}
const json = (text: string, what: string): Effect.Effect<unknown, StateError> =>
  Effect.try({ try: () => JSON.parse(text) as unknown, catch: (cause) => new StateError({ reason: "damaged", message: `${what} is not JSON`, cause }) })

/** The service over the SqlClient in context (a SQLite one), after migrating the file. */
export const make = (file: string): Effect.Effect<Service, StateError, SqlClient.SqlClient> =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const q = <A>(e: Effect.Effect<A, SqlError.SqlError>) => Effect.mapError(e, io)
    yield* q(sql.unsafe("PRAGMA busy_timeout = 5000"))
    // In WAL mode NORMAL survives a crash of the process (kill -9) without an
    // fsync per commit; only a power cut can lose the newest commits, and the
    // server's assignment expiry already covers a device that vanishes.
    yield* q(sql.unsafe("PRAGMA synchronous = NORMAL"))
    yield* migrate

    const loadAssignment = (k: Key) =>
      Effect.flatMap(q(sql<{ doc: string }>`SELECT doc FROM assignments WHERE fleet_id = ${k.fleetId} AND reservation_id = ${k.reservationId}`), (rows) =>
        rows.length === 0
          ? Effect.succeed(null)
          : Effect.flatMap(json(rows[0].doc, `assignment ${k.reservationId}`), (v) => parse(AssignmentRecordSchema, v, `assignment ${k.reservationId} of fleet ${k.fleetId}`))
      )
    const saveAssignment = (a: AssignmentRecord) =>
      Effect.flatMap(parse(AssignmentRecordSchema, a, `assignment ${a.reservationId}`), (checked) =>
        q(sql`INSERT INTO assignments (fleet_id, reservation_id, doc, status) VALUES (${a.fleetId}, ${a.reservationId}, ${JSON.stringify(checked)}, ${a.status})
              ON CONFLICT (fleet_id, reservation_id) DO UPDATE SET doc = excluded.doc, status = excluded.status`)
      )
    const entries = (rows: ReadonlyArray<unknown>) => Effect.forEach(rows, (r) => Effect.map(parse(EventRow, r, "a journal row"), toEntry))
    const loadJournal = (k: Key) =>
      Effect.flatMap(q(sql`SELECT * FROM events WHERE fleet_id = ${k.fleetId} AND reservation_id = ${k.reservationId} ORDER BY seq`), entries)
    const docs = <S extends z.ZodType>(rows: ReadonlyArray<{ doc: string }>, schema: S, what: string) =>
      Effect.forEach(rows, (r) => Effect.flatMap(json(r.doc, what), (v) => parse(schema, v, what)))

    const service: Service = {
      file,
      slots: Effect.flatMap(q(sql<{ doc: string }>`SELECT doc FROM slots ORDER BY slot`), (rows) => docs(rows, SlotStateSchema, "a slot row")),
      putSlot: (s) =>
        Effect.flatMap(parse(SlotStateSchema, s, `slot ${s.slot}`), (checked) =>
          Effect.asVoid(q(sql`INSERT INTO slots (slot, doc) VALUES (${s.slot}, ${JSON.stringify(checked)}) ON CONFLICT (slot) DO UPDATE SET doc = excluded.doc`))
        ),
      assignment: loadAssignment,
      assignments: (o) => {
        const fleet = o?.fleetId !== undefined ? sql`fleet_id = ${o.fleetId}` : sql`1 = 1`
        const open = o?.open ? sql`status <> 'done'` : sql`1 = 1`
        return Effect.flatMap(
          q(sql<{ doc: string }>`SELECT doc FROM assignments WHERE ${open} AND ${fleet} ORDER BY n DESC LIMIT ${o?.limit ?? (o?.open ? 100_000 : 1000)}`),
          (rows) => docs(rows, AssignmentRecordSchema, "an assignment row")
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
              const event: PhaseModel.Event = {
                seq: (journal.at(-1)?.seq ?? 0) + 1,
                kind: e.kind,
                phase: e.phase,
                at: e.at,
                ...(e.detail !== undefined ? { detail: e.detail.slice(0, 1000) } : {})
              }
              const checked = PhaseModel.append({ events: journal, phase: journal.at(-1)?.phase ?? null, lastSeq: journal.at(-1)?.seq ?? 0 }, event)
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
      pendingEvents: (k, limit) =>
        Effect.flatMap(
          q(sql`SELECT * FROM events WHERE fleet_id = ${k.fleetId} AND reservation_id = ${k.reservationId} AND delivery = 'pending' ORDER BY seq LIMIT ${limit}`),
          entries
        ),
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
        Effect.flatMap(q(sql`SELECT * FROM results WHERE fleet_id = ${k.fleetId} AND reservation_id = ${k.reservationId}`), (rows) =>
          rows.length === 0
            ? Effect.succeed(null)
            : Effect.gen(function* () {
                const r = yield* parse(ResultRow, rows[0], `the result of ${k.reservationId}`)
                const body = yield* json(r.body, `the result of ${k.reservationId}`)
                const common = { ...k, afterSeq: r.after_seq, delivery: r.delivery, attempts: r.attempts, error: r.error }
                return r.kind === "release"
                  ? ({ ...common, kind: "release", body: yield* parse(WorkerApi.ReleaseRequest, body, "a release") } as const)
                  : ({ ...common, kind: "result", body: yield* parse(WorkerApi.ResultRequest, body, "a result") } as const)
              })
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
                // Before fleet ids, a file only ever spoke to one fleet: the first one it meets now.
                yield* sql`UPDATE assignments SET fleet_id = ${fleetId}, doc = json_set(doc, '$.fleetId', ${fleetId}, '$.view.fleetId', ${fleetId}) WHERE fleet_id = ${legacyFleet}`
                yield* sql`UPDATE events SET fleet_id = ${fleetId} WHERE fleet_id = ${legacyFleet}`
                yield* sql`UPDATE results SET fleet_id = ${fleetId} WHERE fleet_id = ${legacyFleet}`
                yield* sql`UPDATE slots SET doc = json_set(doc, '$.fleetId', ${fleetId}) WHERE json_extract(doc, '$.fleetId') = ${legacyFleet}`
              }
              yield* sql`INSERT INTO fleets (fleet_id, server, first_seen, last_seen) VALUES (${fleetId}, ${server}, ${at}, ${at})
                         ON CONFLICT (fleet_id) DO UPDATE SET server = excluded.server, last_seen = excluded.last_seen`
            })
          ),
          io
        ),
      controller: Effect.flatMap(q(sql<{ value: string }>`SELECT value FROM meta WHERE key = 'controller'`), (rows) =>
        rows.length === 0 ? Effect.succeed(null) : Effect.flatMap(json(rows[0].value, "the controller record"), (v) => parse(ControllerInfoSchema, v, "the controller record"))
      ),
      putController: (c) =>
        Effect.asVoid(
          q(sql`INSERT INTO meta (key, value) VALUES ('controller', ${JSON.stringify(ControllerInfoSchema.parse(c))}) ON CONFLICT (key) DO UPDATE SET value = excluded.value`)
        )
    }
    return service
  })

/**
 * The service on its own SQLite connection to `file` (created if missing).
 *
 * @example
 * const StateLive = LocalState.layer("./worker.db")
 */
export const layer = (file: string): Layer.Layer<State, StateError> =>
  Layer.effect(State, make(file)).pipe(
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
    close
  }
}

/**
 * Opens (and migrates) the state file as Promises.
 *
 * @example
 * const state = await LocalState.open("./worker.db")
 * console.log(await state.fleets())
 * await state.close()
 */
export const open = async (file: string): Promise<LocalState> => {
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
