import { SqlClient } from "@effect/sql"
import { Effect, Schedule } from "effect"
import { Errors } from "@scanfleet/core"
import * as Migrator from "../Migrator.js"
import { codeOf, reasonOf } from "./SqlErrors.js"

// The migrator creates its table when a look-up does not find it, outside its transaction, so two
// processes starting on one empty PostgreSQL database both create it and one of them fails: a
// duplicate in the catalogue (23505 on pg_type's name index) or a duplicate table (42P07); a
// fresh-clone run also saw another statement error of that race. Run again, that one finds the
// table, and the migrator's lock on it serialises the rest; the migrations themselves run in one
// transaction, so running them again after any database error is safe.
const concurrentStart = (e: unknown) => typeof e === "object" && e !== null && (e as { _tag?: unknown })._tag === "SqlError"

/** A failure's message with the messages of its causes, and the database's code where it gave one. */
export const describe = (e: unknown): string => {
  const parts: Array<string> = []
  for (let c: unknown = e, depth = 0; c !== undefined && c !== null && depth < 5; c = (c as { cause?: unknown }).cause, depth++) {
    const message = c instanceof Error || (typeof c === "object" && "message" in c) ? String((c as { message: unknown }).message) : String(c)
    if (message !== "" && !parts.includes(message)) parts.push(message)
  }
  const code = codeOf(e) || codeOf((e as { cause?: unknown })?.cause) || codeOf((e as { cause?: { cause?: unknown } })?.cause?.cause)
  return `${parts.join(": ")}${code ? ` (${code})` : ""}`
}

/** The deepest database error of a failure: a migration's failure is the migrator's error, whose cause is the statement's. */
const rootOf = (e: unknown): unknown => {
  let c = e
  for (let depth = 0; depth < 5 && typeof c === "object" && c !== null && (c as { cause?: unknown }).cause !== undefined; depth++) c = (c as { cause?: unknown }).cause
  return c
}

/** A migration that failed on a lock (a deadlock, `lockWait` passed, a busy SQLite file) runs again: every attempt is one transaction. */
const lockFailure = (e: unknown) => {
  const root = rootOf(e)
  return codeOf(root) !== "" && reasonOf(root) === "conflict"
}

/** How often, and how far apart, a migration that gave way to running statements runs again: about a minute in all. */
export const retries = Schedule.exponential("250 millis", 1.5).pipe(Schedule.union(Schedule.spaced("5 seconds")), Schedule.intersect(Schedule.recurs(20)))

/** The migrations' own table's newest id, or 0 when there is none yet. */
const storedVersion = (dialect: Migrator.Dialect) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const exists =
      dialect === "pg"
        ? yield* sql<{ x: number }>`SELECT 1 AS x WHERE to_regclass(${Migrator.table}) IS NOT NULL`
        : yield* sql<{ x: number }>`SELECT 1 AS x FROM sqlite_master WHERE type = 'table' AND name = ${Migrator.table}`
    if (exists.length === 0) return 0
    const [row] = yield* sql<{ v: number | string | null }>`SELECT max(migration_id) AS v FROM ${sql(Migrator.table)}`
    return Number(row?.v ?? 0)
  })

/**
 * Runs a dialect's migrations with every failure as a StoreError. A database whose schema is newer
 * than this build's (`Migrator.latest`) is refused: this build would misread it. A migration that
 * gives way to running statements' locks runs again (`retries`), each time logged.
 */
export const run = (dialect: Migrator.Dialect): Effect.Effect<void, Errors.StoreError, SqlClient.SqlClient> =>
  Effect.gen(function* () {
    const stored = yield* storedVersion(dialect).pipe(Effect.retry({ while: concurrentStart, schedule: Schedule.spaced("50 millis"), times: 3 }))
    if (stored > Migrator.latest)
      return yield* new Errors.StoreError({
        reason: "invalid",
        message: `the ${dialect} database's schema is at migration ${stored}, newer than this build's ${Migrator.latest}: run a build that knows it (this one would misread its tables)`
      })
    yield* Migrator.migrate(dialect).pipe(
      Effect.retry({ while: concurrentStart, schedule: Schedule.spaced("50 millis"), times: 3 }),
      // a migration's failure is a defect of the migrator; one that lost a lock is made a failure, to run again
      Effect.catchAllDefect((d) => (lockFailure(d) ? Effect.fail({ _tag: "LockFailure" as const, cause: d }) : Effect.die(d))),
      Effect.tapError((e) =>
        e._tag === "LockFailure" ? Effect.logWarning(`migrating the ${dialect} schema gave way to running statements' locks (${describe(e.cause)}); it runs again`) : Effect.void
      ),
      Effect.retry({ while: (e) => e._tag === "LockFailure", schedule: retries })
    )
  }).pipe(
    Effect.catchAll((e) =>
      e._tag === "StoreError"
        ? Effect.fail(e)
        : Effect.fail(
            new Errors.StoreError({
              reason: e._tag === "LockFailure" ? "conflict" : e._tag === "SqlError" ? reasonOf(e.cause) : "unavailable",
              message:
                e._tag === "LockFailure"
                  ? `migrating the ${dialect} schema: running statements held its tables through every attempt (${describe(e.cause)}); stop the instances of the older build, then start this one`
                  : `migrating the ${dialect} schema: ${describe(e)}`,
              cause: e
            })
          )
    ),
    Effect.catchAllDefect((d) => Effect.fail(new Errors.StoreError({ reason: "unavailable", message: `migrating the ${dialect} schema failed: ${describe(d)}`, cause: d })))
  )
