import type { SqlClient } from "@effect/sql"
import { Effect, Schedule } from "effect"
import { Errors } from "@scanfleet/core"
import * as Migrator from "../Migrator.js"
import { reasonOf } from "./SqlErrors.js"

// The migrator creates its table when a look-up does not find it, outside its transaction, so two
// processes starting on one empty PostgreSQL database both create it and one of them fails: a
// duplicate in the catalogue (23505 on pg_type's name index) or a duplicate table (42P07); a
// fresh-clone run also saw another statement error of that race. Run again, that one finds the
// table, and the migrator's lock on it serialises the rest; the migrations themselves run in one
// transaction, so running them again after any database error is safe.
const concurrentStart = (e: unknown) => typeof e === "object" && e !== null && (e as { _tag?: unknown })._tag === "SqlError"

/** Runs a dialect's migrations with every failure as a StoreError. */
export const run = (dialect: Migrator.Dialect): Effect.Effect<void, Errors.StoreError, SqlClient.SqlClient> =>
  Migrator.migrate(dialect).pipe(
    Effect.retry({ while: concurrentStart, schedule: Schedule.spaced("50 millis"), times: 3 }),
    Effect.asVoid,
    Effect.mapError((e) => new Errors.StoreError({ reason: e._tag === "SqlError" ? reasonOf(e.cause) : "unavailable", message: `migrating the ${dialect} schema: ${e.message}`, cause: e })),
    Effect.catchAllDefect((d) => Effect.fail(new Errors.StoreError({ reason: "unavailable", message: `migrating the ${dialect} schema failed: ${String(d)}`, cause: d })))
  )
