import { SqlClient } from "@effect/sql"
import { SqliteClient } from "@effect/sql-sqlite-node"
import { Assignment, PhaseModel, WorkerApi } from "@scanfleet/core"
import { Cause, Data, Effect, Exit, ManagedRuntime } from "effect"
import { z } from "zod"

/**
 * The device's local state in one SQLite file: slots, the assignments they
 * ran, the phase journal (which doubles as the progress outbox) and the
 * result outbox. The controller writes a row before it acts on it, so a
 * restart finds every process group and every undelivered event.
 */

/** Where the execution unit of an assignment runs, so a restart can kill it. */
export const RunnerSchema = z
  .object({ pid: z.number().int().positive(), pgid: z.number().int().positive(), startTime: z.string().nullable() })
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

/** One slot: idle, or running the execution unit of a reservation. */
export const SlotStateSchema = z
  .object({ slot: z.number().int().min(0), reservationId: z.number().int().positive().nullable(), updatedAt: z.number().int() })
  .strict()
/** One slot's state. */
export type SlotState = z.infer<typeof SlotStateSchema>

/** Delivery state of one outbox item. `local` events are never sent (after the server closed the reservation). */
export const deliveries = ["pending", "acked", "local", "refused", "abandoned"] as const
/** Delivery state of one outbox item. */
export type Delivery = (typeof deliveries)[number]

/** One journal entry: a phase event and its delivery. */
export interface JournalEntry extends PhaseModel.Event {
  readonly reservationId: number
  readonly delivery: Delivery
  readonly ackedAt: number | null
  readonly error: string | null
}

/**
 * The last word on a reservation, waiting in the outbox: a result, or a
 * release (the device gives the target back). Sent once every event up to
 * `afterSeq` left the outbox.
 */
export type OutboxResult = {
  readonly reservationId: number
  readonly afterSeq: number
  readonly delivery: Delivery
  readonly attempts: number
  readonly error: string | null
} & (
  | { readonly kind: "result"; readonly body: z.infer<typeof WorkerApi.ResultRequest> }
  | { readonly kind: "release"; readonly body: z.infer<typeof WorkerApi.ReleaseRequest> }
)

const EventRow = z.object({
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
  reservation_id: z.number(),
  after_seq: z.number(),
  body: z.string(),
  delivery: z.enum(deliveries),
  attempts: z.number(),
  error: z.string().nullable(),
  kind: z.enum(["result", "release"])
})

// Forward-only; PRAGMA user_version records how far a file has come.
const migrations: ReadonlyArray<ReadonlyArray<string>> = [
  [
    `CREATE TABLE slots (slot INTEGER PRIMARY KEY, doc TEXT NOT NULL)`,
    `CREATE TABLE assignments (reservation_id INTEGER PRIMARY KEY, doc TEXT NOT NULL)`,
    `CREATE TABLE events (
       reservation_id INTEGER NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, phase TEXT NOT NULL,
       at INTEGER NOT NULL, detail TEXT, delivery TEXT NOT NULL, acked_at INTEGER, error TEXT,
       PRIMARY KEY (reservation_id, seq))`,
    `CREATE INDEX events_pending ON events (delivery, reservation_id, seq)`,
    `CREATE TABLE results (
       reservation_id INTEGER PRIMARY KEY, after_seq INTEGER NOT NULL, body TEXT NOT NULL,
       delivery TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, error TEXT)`
  ],
  [`ALTER TABLE results ADD COLUMN kind TEXT NOT NULL DEFAULT 'result'`],
  // Open assignments are found by an indexed column, however long the device's history grows.
  [
    `ALTER TABLE assignments ADD COLUMN status TEXT NOT NULL DEFAULT 'running'`,
    `UPDATE assignments SET status = json_extract(doc, '$.status')`,
    `CREATE INDEX assignments_open ON assignments (status, reservation_id) WHERE status <> 'done'`
  ]
]

const toEntry = (r: z.infer<typeof EventRow>): JournalEntry => ({
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

/** An append the phase model refused; nothing was written. */
export class JournalRefused extends Data.TaggedError("JournalRefused")<{
  readonly reason: PhaseModel.Refusal["reason"]
  readonly seq: number
  readonly message: string
}> {}

/** The local state of a device: an open SQLite file. */
export interface LocalState {
  readonly file: string
  /** Every slot row. */
  readonly slots: () => Promise<ReadonlyArray<SlotState>>
  /** Writes one slot row. */
  readonly putSlot: (s: SlotState) => Promise<void>
  /** One assignment, or null. */
  readonly assignment: (reservationId: number) => Promise<AssignmentRecord | null>
  /** Assignments, newest first; optionally only those not yet done. */
  readonly assignments: (q?: { readonly open?: boolean; readonly limit?: number }) => Promise<ReadonlyArray<AssignmentRecord>>
  /** Writes one assignment row (before the controller acts on it). */
  readonly putAssignment: (a: AssignmentRecord) => Promise<void>
  /**
   * Appends the next event of a reservation's timeline with core's phase
   * model, updating the assignment's phase and last sequence in the same
   * transaction. `delivery: "local"` keeps it out of the outbox.
   */
  readonly append: (
    reservationId: number,
    e: { readonly kind: "phase" | "recovered"; readonly phase: PhaseModel.Phase; readonly at: number; readonly detail?: string },
    delivery?: "pending" | "local"
  ) => Promise<PhaseModel.Event>
  /** The whole journal of a reservation, in sequence order. */
  readonly journal: (reservationId: number) => Promise<ReadonlyArray<JournalEntry>>
  /** Reservations with undelivered events or results, oldest first. */
  readonly outboxReservations: () => Promise<ReadonlyArray<number>>
  /** Pending events of a reservation in sequence order. */
  readonly pendingEvents: (reservationId: number, limit: number) => Promise<ReadonlyArray<JournalEntry>>
  /** Marks events delivered (or refused, or abandoned). */
  readonly markEvents: (reservationId: number, seqs: ReadonlyArray<number>, delivery: Delivery, at: number, error?: string) => Promise<void>
  /** Queues a result (or a release) after the events up to `afterSeq`. */
  readonly putResult: (
    r: { readonly reservationId: number; readonly afterSeq: number } & (
      | { readonly kind?: "result"; readonly body: z.infer<typeof WorkerApi.ResultRequest> }
      | { readonly kind: "release"; readonly body: z.infer<typeof WorkerApi.ReleaseRequest> }
    )
  ) => Promise<void>
  /** The queued result of a reservation. */
  readonly result: (reservationId: number) => Promise<OutboxResult | null>
  /** Records a result delivery attempt's outcome. */
  readonly markResult: (reservationId: number, delivery: Delivery, error?: string) => Promise<void>
  /** Closes the file. */
  readonly close: () => Promise<void>
}

/**
 * Opens (and migrates) the state file.
 *
 * @example
 * const state = await LocalState.open("./worker.db")
 */
export const open = async (file: string): Promise<LocalState> => {
  const rt = ManagedRuntime.make(SqliteClient.layer({ filename: file }))
  // Failures surface as themselves (a JournalRefused, a zod error), not wrapped in a fiber failure.
  const run = async <A>(f: (sql: SqlClient.SqlClient) => Effect.Effect<A, unknown>): Promise<A> => {
    const exit = await rt.runPromiseExit(Effect.flatMap(SqlClient.SqlClient, f))
    if (Exit.isSuccess(exit)) return exit.value
    throw Cause.squash(exit.cause)
  }

  await run((sql) =>
    Effect.gen(function* () {
      yield* sql.unsafe("PRAGMA busy_timeout = 5000")
      // In WAL mode NORMAL survives a crash of the process (kill -9) without an
      // fsync per commit; only a power cut can lose the newest commits, and the
      // server's assignment expiry already covers a device that vanishes.
      yield* sql.unsafe("PRAGMA synchronous = NORMAL")
      const [{ user_version }] = (yield* sql.unsafe("PRAGMA user_version")) as unknown as Array<{ user_version: number }>
      for (let v = user_version; v < migrations.length; v++) {
        yield* sql.withTransaction(
          Effect.gen(function* () {
            for (const stmt of migrations[v]) yield* sql.unsafe(stmt)
            yield* sql.unsafe(`PRAGMA user_version = ${v + 1}`)
          })
        )
      }
    })
  )

  const loadAssignment = (sql: SqlClient.SqlClient, id: number) =>
    Effect.map(sql<{ doc: string }>`SELECT doc FROM assignments WHERE reservation_id = ${id}`, (rows) =>
      rows.length === 0 ? null : AssignmentRecordSchema.parse(JSON.parse(rows[0].doc))
    )
  const saveAssignment = (sql: SqlClient.SqlClient, a: AssignmentRecord) => {
    const doc = JSON.stringify(AssignmentRecordSchema.parse(a))
    return sql`INSERT INTO assignments (reservation_id, doc, status) VALUES (${a.reservationId}, ${doc}, ${a.status})
               ON CONFLICT (reservation_id) DO UPDATE SET doc = excluded.doc, status = excluded.status`
  }
  const loadJournal = (sql: SqlClient.SqlClient, id: number) =>
    Effect.map(sql`SELECT * FROM events WHERE reservation_id = ${id} ORDER BY seq`, (rows) => rows.map((r) => toEntry(EventRow.parse(r))))

  return {
    file,
    slots: () =>
      run((sql) => Effect.map(sql<{ doc: string }>`SELECT doc FROM slots ORDER BY slot`, (rows) => rows.map((r) => SlotStateSchema.parse(JSON.parse(r.doc))))),
    putSlot: (s) =>
      run((sql) => {
        const doc = JSON.stringify(SlotStateSchema.parse(s))
        return Effect.asVoid(sql`INSERT INTO slots (slot, doc) VALUES (${s.slot}, ${doc}) ON CONFLICT (slot) DO UPDATE SET doc = excluded.doc`)
      }),
    assignment: (id) => run((sql) => loadAssignment(sql, id)),
    assignments: (q) =>
      run((sql) =>
        Effect.map(
          q?.open
            ? sql<{ doc: string }>`SELECT doc FROM assignments WHERE status <> 'done' ORDER BY reservation_id DESC LIMIT ${q?.limit ?? 100_000}`
            : sql<{ doc: string }>`SELECT doc FROM assignments ORDER BY reservation_id DESC LIMIT ${q?.limit ?? 1000}`,
          (rows) => rows.map((r) => AssignmentRecordSchema.parse(JSON.parse(r.doc)))
        )
      ),
    putAssignment: (a) => run((sql) => Effect.asVoid(saveAssignment(sql, a))),
    append: (id, e, delivery = "pending") =>
      run((sql) =>
        sql.withTransaction(
          Effect.gen(function* () {
            const a = yield* loadAssignment(sql, id)
            if (a === null) return yield* Effect.die(new Error(`no assignment ${id} in the local state`))
            const journal = yield* loadJournal(sql, id)
            const event: PhaseModel.Event = {
              seq: (journal.at(-1)?.seq ?? 0) + 1,
              kind: e.kind,
              phase: e.phase,
              at: e.at,
              ...(e.detail !== undefined ? { detail: e.detail.slice(0, 1000) } : {})
            }
            const checked = PhaseModel.append({ events: journal, phase: journal.at(-1)?.phase ?? null, lastSeq: journal.at(-1)?.seq ?? 0 }, event)
            if (checked._tag === "Left") return yield* Effect.fail(new JournalRefused({ ...checked.left }))
            yield* sql`INSERT INTO events (reservation_id, seq, kind, phase, at, detail, delivery)
                       VALUES (${id}, ${event.seq}, ${event.kind}, ${event.phase}, ${event.at}, ${event.detail ?? null}, ${delivery})`
            yield* saveAssignment(sql, { ...a, phase: event.phase, lastSeq: event.seq })
            return event
          })
        )
      ),
    journal: (id) => run((sql) => loadJournal(sql, id)),
    outboxReservations: () =>
      run((sql) =>
        Effect.map(
          sql<{ id: number }>`SELECT reservation_id AS id FROM events WHERE delivery = 'pending'
                              UNION SELECT reservation_id AS id FROM results WHERE delivery = 'pending' ORDER BY id`,
          (rows) => rows.map((r) => r.id)
        )
      ),
    pendingEvents: (id, limit) =>
      run((sql) =>
        Effect.map(sql`SELECT * FROM events WHERE reservation_id = ${id} AND delivery = 'pending' ORDER BY seq LIMIT ${limit}`, (rows) =>
          rows.map((r) => toEntry(EventRow.parse(r)))
        )
      ),
    markEvents: (id, seqs, delivery, at, error) =>
      run((sql) =>
        sql.withTransaction(
          Effect.forEach(
            seqs,
            (seq) => sql`UPDATE events SET delivery = ${delivery}, acked_at = ${at}, error = ${error ?? null} WHERE reservation_id = ${id} AND seq = ${seq}`,
            { discard: true }
          )
        )
      ),
    putResult: (r) =>
      run((sql) => {
        const kind = r.kind ?? "result"
        const body = JSON.stringify(r.kind === "release" ? WorkerApi.ReleaseRequest.parse(r.body) : WorkerApi.ResultRequest.parse(r.body))
        return Effect.asVoid(sql`INSERT INTO results (reservation_id, after_seq, body, delivery, kind) VALUES (${r.reservationId}, ${r.afterSeq}, ${body}, 'pending', ${kind})
                                 ON CONFLICT (reservation_id) DO NOTHING`)
      }),
    result: (id) =>
      run((sql) =>
        Effect.map(sql`SELECT * FROM results WHERE reservation_id = ${id}`, (rows): OutboxResult | null => {
          if (rows.length === 0) return null
          const r = ResultRow.parse(rows[0])
          const common = { reservationId: r.reservation_id, afterSeq: r.after_seq, delivery: r.delivery, attempts: r.attempts, error: r.error }
          return r.kind === "release"
            ? { ...common, kind: "release" as const, body: WorkerApi.ReleaseRequest.parse(JSON.parse(r.body)) }
            : { ...common, kind: "result" as const, body: WorkerApi.ResultRequest.parse(JSON.parse(r.body)) }
        })
      ),
    markResult: (id, delivery, error) =>
      run((sql) =>
        Effect.asVoid(sql`UPDATE results SET delivery = ${delivery}, attempts = attempts + 1, error = ${error ?? null} WHERE reservation_id = ${id}`)
      ),
    close: () => rt.dispose()
  }
}
