import type { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import { Errors } from "@scanfleet/core"
import * as Migrator from "../Migrator.js"
import { reasonOf } from "./SqlErrors.js"

/** Runs a dialect's migrations with every failure as a StoreError. */
export const run = (dialect: Migrator.Dialect): Effect.Effect<void, Errors.StoreError, SqlClient.SqlClient> =>
  Migrator.migrate(dialect).pipe(
    Effect.asVoid,
    Effect.mapError((e) => new Errors.StoreError({ reason: e._tag === "SqlError" ? reasonOf(e.cause) : "unavailable", message: `migrating the ${dialect} schema: ${e.message}`, cause: e })),
    Effect.catchAllDefect((d) => Effect.fail(new Errors.StoreError({ reason: "unavailable", message: `migrating the ${dialect} schema failed: ${String(d)}`, cause: d })))
  )
