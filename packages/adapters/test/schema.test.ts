import { existsSync, readFileSync, writeFileSync } from "node:fs"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { SqliteClient } from "@effect/sql-sqlite-node"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { inject } from "vitest"
import * as Migrator from "../src/Migrator.js"
import * as PgStore from "../src/PgStore.js"
import * as SqliteStore from "../src/SqliteStore.js"
import { schema, urlFor } from "./support/PgSchema.js"
import * as SchemaDump from "./support/SchemaDump.js"

// Set SCANFLEET_UPDATE_SCHEMA=1 to rewrite the committed dumps after adding a migration.
const update = process.env.SCANFLEET_UPDATE_SCHEMA === "1"
const dumpPath = (dialect: Migrator.Dialect) => fileURLToPath(new URL(`../schema/${dialect}.sql`, import.meta.url))

const matchesCommitted = (dialect: Migrator.Dialect, dump: string) => {
  const path = dumpPath(dialect)
  if (update || !existsSync(path)) writeFileSync(path, dump)
  expect(dump, `schema/${dialect}.sql is stale: rerun with SCANFLEET_UPDATE_SCHEMA=1 and commit the diff`).toBe(readFileSync(path, "utf8"))
}

const withPg = <A, E>(self: Effect.Effect<A, E, SqlClient.SqlClient>) =>
  Effect.scoped(
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      return yield* Effect.provide(self, yield* Layer.build(PgClient.layer({ url: Redacted.make(urlFor(inject("pgUrl"), name)), types: PgStore.types })))
    })
  )

const withSqlite = <A, E>(self: Effect.Effect<A, E, SqlClient.SqlClient>) =>
  Effect.provide(self, SqliteClient.layer({ filename: join(mkdtempSync(join(tmpdir(), "scanfleet-schema-")), "schema.db") }))

describe("schema", () => {
  it("both dialects have the same migration id list", () => {
    expect(Migrator.ids("sqlite")).toEqual(Migrator.ids("pg"))
    expect(Migrator.ids("pg")[0]).toBe("0001_queue")
    expect(Migrator.ids("pg").map((id) => Number(id.slice(0, 4)))).toEqual(Migrator.ids("pg").map((_, i) => i + 1))
  })

  it.live("postgres: migrations run once, in order, and the result matches schema/pg.sql", () =>
    withPg(
      Effect.gen(function* () {
        const ran = yield* Migrator.migrate("pg")
        expect(ran.map(([id, name]) => `${String(id).padStart(4, "0")}_${name}`)).toEqual(Migrator.ids("pg"))
        expect(yield* Migrator.migrate("pg")).toEqual([])
        matchesCommitted("pg", yield* SchemaDump.pg)
      })
    ))

  it.live("sqlite: migrations run once, in order, and the result matches schema/sqlite.sql", () =>
    withSqlite(
      Effect.gen(function* () {
        const ran = yield* Migrator.migrate("sqlite")
        expect(ran.map(([id, name]) => `${String(id).padStart(4, "0")}_${name}`)).toEqual(Migrator.ids("sqlite"))
        expect(yield* Migrator.migrate("sqlite")).toEqual([])
        matchesCommitted("sqlite", yield* SchemaDump.sqlite)
      })
    ))

  it.live("a store opened on an already migrated database migrates nothing and works", () =>
    withSqlite(
      Effect.gen(function* () {
        yield* SqliteStore.migrate
        const store = yield* SqliteStore.make
        expect(yield* store.countTargets()).toEqual([])
      })
    ))
})
