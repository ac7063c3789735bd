import { existsSync, readFileSync, writeFileSync } from "node:fs"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import type { Errors, Store } from "@scanfleet/core"
import { describe, expect, it } from "@effect/vitest"
import { Migrator as SqlMigrator } from "@effect/sql"
import { Deferred, Effect, Either, Fiber, Layer, Redacted, Schedule } from "effect"
import { inject } from "vitest"
import * as Migrator from "../src/Migrator.js"
import * as MigrationLocks from "../src/internal/MigrationLocks.js"
import * as Rollups from "../src/internal/Rollups.js"
import * as PgStore from "../src/PgStore.js"
import * as SqliteStore from "../src/SqliteStore.js"
import pgQueue from "../src/migrations/pg/0001_queue.js"
import sqliteQueue from "../src/migrations/sqlite/0001_queue.js"
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

const withSqlite = <A, E>(self: Effect.Effect<A, E, SqlClient.SqlClient | SqliteStore.Database>) =>
  Effect.provide(self, SqliteStore.clientLayer({ filename: join(mkdtempSync(join(tmpdir(), "scanfleet-schema-")), "schema.db") }))

describe("schema", () => {
  it("both dialects have the same migration id list", () => {
    expect(Migrator.ids("sqlite")).toEqual(Migrator.ids("pg"))
    expect(Migrator.ids("pg")[0]).toBe("0001_queue")
    // Every id from 0001 to the newest exists exactly once, in order: a gap or a duplicate is a merge mistake.
    const numbers = Migrator.ids("pg").map((id) => Number(id.slice(0, 4)))
    expect(numbers).toEqual(Array.from({ length: numbers.length }, (_, i) => i + 1))
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

  it.live("postgres: stores of two processes opened at once on one empty database both migrate it, once", () =>
    Effect.gen(function* () {
      // Two pools stand for two server processes: the migrator creates its table after a look-up
      // that finds none, so both try to create it; each start must still end migrated. Five rounds,
      // since whether the two meet in that window is a matter of timing.
      for (let round = 0; round < 5; round++)
        yield* Effect.scoped(
          Effect.gen(function* () {
            const url = urlFor(inject("pgUrl"), yield* schema(inject("pgUrl")))
            const pool = () => Layer.build(PgClient.layer({ url: Redacted.make(url), types: PgStore.types }))
            const [a, b] = [yield* pool(), yield* pool()]
            yield* Effect.all([Effect.provide(PgStore.migrate, a), Effect.provide(PgStore.migrate, b)], { concurrency: 2 })
            const ran = yield* Effect.provide(
              Effect.flatMap(SqlClient.SqlClient, (sql) => sql<{ n: number }>`SELECT count(*)::int AS n FROM ${sql(Migrator.table)}`),
              a
            )
            expect(ran[0].n).toBe(Migrator.ids("pg").length)
          })
        )
    }))

  it.live("sqlite: migrations run once, in order, and the result matches schema/sqlite.sql", () =>
    withSqlite(
      Effect.gen(function* () {
        const ran = yield* Migrator.migrate("sqlite")
        expect(ran.map(([id, name]) => `${String(id).padStart(4, "0")}_${name}`)).toEqual(Migrator.ids("sqlite"))
        expect(yield* Migrator.migrate("sqlite")).toEqual([])
        matchesCommitted("sqlite", yield* SchemaDump.sqlite)
      })
    ))

  // A database left at the oldest schema version, holding data, is upgraded in place by opening a store.
  const upgrade = <R>(first: Effect.Effect<void, unknown, SqlClient.SqlClient>, make: Effect.Effect<Store.StoreShape, Errors.StoreError, R>) =>
    Effect.gen(function* () {
      const ran = yield* SqlMigrator.make({})({ loader: SqlMigrator.fromRecord({ "0001_queue": first }), table: Migrator.table })
      expect(ran).toEqual([[1, "queue"]])
      const sql = yield* SqlClient.SqlClient
      yield* sql`INSERT INTO targets (source, identity, status, observed_remote_at, discovered_at) VALUES ('github', 'old/one', 'pending', 5, 1)`
      const store = yield* make
      expect(yield* store.getTarget("github", "old/one")).toMatchObject({ status: "pending", observedRemoteAt: 5, fence: 0 })
      const cycle = yield* store.recordCycle({ source: "github", startedAt: 1, endedAt: 2, pages: 1, results: 1, malformed: 0, queuedNewCount: 0, queuedUpdatedCount: 0, deferredCount: 0, stopReason: "end_of_listing", error: null })
      expect(yield* store.listCycles({ limit: 5 })).toEqual([cycle])
    })

  it.live("postgres: a database at the oldest schema version is upgraded with its data", () => withPg(upgrade(pgQueue, PgStore.make)))
  it.live("sqlite: a database at the oldest schema version is upgraded with its data", () => withSqlite(upgrade(sqliteQueue, SqliteStore.make)))

  it.live("sqlite: rollups written before 0017 keep every count under the key by span and start, new durations still roll up, and durations are indexed by source and time", () =>
    withSqlite(
      Effect.gen(function* () {
        // the schema as 0016 left it, from the migrations themselves
        const before = Migrator.ids("sqlite").filter((id) => id < "0017")
        const record: Record<string, Effect.Effect<void, unknown, SqlClient.SqlClient>> = {}
        for (const id of before) record[id] = (yield* Effect.promise(() => import(/* @vite-ignore */ new URL(`../src/migrations/sqlite/${id}.ts`, import.meta.url).href))).default
        expect(yield* SqlMigrator.make({})({ loader: SqlMigrator.fromRecord(record), table: Migrator.table })).toHaveLength(before.length)
        const sql = yield* SqlClient.SqlClient
        const key = (rows: ReadonlyArray<{ sql: string }>) => /PRIMARY KEY \(([^)]*)\)/.exec(rows[0].sql)?.[1]
        const tableSql = sql<{ sql: string }>`SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'duration_rollups'`
        expect(key(yield* tableSql)).toBe("span, source, metric, outcome, start, chunk")
        // durations over two days in two sources, rolled up by 0005's trigger
        const day = 86_400_000
        for (let i = 0; i < 400; i++)
          yield* sql`INSERT INTO durations (source, metric, outcome, ms, at) VALUES (${i % 2 === 0 ? "github" : "gitlab"}, 'end_to_end', 'clean', ${1 + i * 37}, ${day + i * 431_000})`
        const rollups = sql`SELECT * FROM duration_rollups ORDER BY span, source, metric, outcome, start, chunk`
        const written = yield* rollups
        expect(written.length).toBeGreaterThan(100)
        const store = yield* SqliteStore.make
        expect(key(yield* tableSql)).toBe("span, start, source, metric, outcome, chunk")
        expect(yield* rollups).toEqual(written)
        const index = yield* sql<{ sql: string }>`SELECT sql FROM sqlite_master WHERE type = 'index' AND name = 'durations_source_idx'`
        expect(index[0].sql).toBe("CREATE INDEX durations_source_idx ON durations (source, at)")
        // the trigger is there again: a duration recorded now is counted, once in every span
        yield* store.recordDurations([{ source: "github", metric: "end_to_end", outcome: "clean", ms: 5, at: day + 400 * 431_000 }])
        const total = sql<{ span: number; n: number }>`SELECT span, ${sql.literal(Array.from({ length: Rollups.width }, (_, i) => `sum(c${i})`).join(" + "))} AS n FROM duration_rollups GROUP BY span ORDER BY span`
        expect((yield* total).map((r) => Number(r.n))).toEqual([401, 401, 401, 401])
        const [all] = yield* store.percentiles({ from: 0, to: 4 * day, source: "github", minSamples: 1 })
        expect(all.count).toBe(201)
      })
    ))

  // The migrations of one dialect up to (not including) `upTo`, as a record the migrator runs.
  const migrationsBefore = (dialect: Migrator.Dialect, upTo: string) =>
    Effect.gen(function* () {
      const record: Record<string, Effect.Effect<void, unknown, SqlClient.SqlClient>> = {}
      for (const id of Migrator.ids(dialect).filter((i) => i < upTo))
        record[id] = (yield* Effect.promise(() => import(/* @vite-ignore */ new URL(`../src/migrations/${dialect}/${id}.ts`, import.meta.url).href))).default
      return record
    })

  it.live("postgres: the tables a migration locks first are every table the migrations create, but their own", () =>
    withPg(
      Effect.gen(function* () {
        yield* Migrator.migrate("pg")
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ name: string }>`SELECT tablename AS name FROM pg_tables WHERE schemaname = current_schema() AND tablename <> ${Migrator.table}`
        expect(rows.map((r) => r.name).sort()).toEqual([...MigrationLocks.tables].sort())
      })
    ))

  it.live("postgres: an upgrade that meets an older build's statements holding its tables gives way to them and runs again until migrated; their transaction ends", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const url = urlFor(inject("pgUrl"), yield* schema(inject("pgUrl")))
        const pool = () => Layer.build(PgClient.layer({ url: Redacted.make(url), types: PgStore.types }))
        const [migrating, older] = [yield* pool(), yield* pool()]
        // the schema as an instance of the 0009 era left it
        const record = yield* migrationsBefore("pg", "0010")
        yield* Effect.provide(SqlMigrator.make({})({ loader: SqlMigrator.fromRecord(record), table: Migrator.table }), migrating)
        // An older build's transaction holds `assignments` (a claim inserts a reservation), then, once
        // the migration waits for it, wants `targets`, which 0010 altered first: a deadlock
        // PostgreSQL ended by failing the migration, every time.
        const holding = yield* Deferred.make<void>()
        const olderWork = Effect.flatMap(SqlClient.SqlClient, (sql) =>
          sql.withTransaction(
            Effect.gen(function* () {
              yield* sql`LOCK TABLE assignments IN ROW EXCLUSIVE MODE`
              yield* Deferred.succeed(holding, undefined)
              yield* sql<{ x: number }>`SELECT 1 AS x FROM pg_locks WHERE NOT granted AND relation = to_regclass('assignments')`.pipe(
                Effect.repeat({ until: (rows) => rows.length > 0, schedule: Schedule.spaced("20 millis") })
              )
              return yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM targets`
            })
          )
        )
        const olderFiber = yield* Effect.fork(Effect.either(Effect.provide(olderWork, older)))
        yield* Deferred.await(holding)
        yield* Effect.provide(PgStore.migrate, migrating)
        const version = yield* Effect.provide(
          Effect.flatMap(SqlClient.SqlClient, (sql) => sql<{ v: number }>`SELECT max(migration_id)::int AS v FROM ${sql(Migrator.table)}`),
          migrating
        )
        expect(version[0].v).toBe(Migrator.latest)
        // The older transaction ends either way: it finishes, or (when its own deadlock check ran first) PostgreSQL ends it as the deadlock's victim.
        const done = yield* Fiber.join(olderFiber)
        if (Either.isRight(done)) expect(done.right).toEqual([{ n: 0 }])
        else expect(String((done.left as { cause?: { code?: unknown } }).cause?.code), String(done.left)).toBe("40P01")
      })
    ))

  const newer = <R>(dialect: Migrator.Dialect, migrate: Effect.Effect<void, Errors.StoreError, R | SqlClient.SqlClient>) =>
    Effect.gen(function* () {
      yield* Migrator.migrate(dialect)
      const sql = yield* SqlClient.SqlClient
      yield* sql`INSERT INTO ${sql(Migrator.table)} (migration_id, name) VALUES (${Migrator.latest + 1}, 'from_a_newer_build')`
      const refused = yield* Effect.flip(migrate)
      expect(refused.reason).toBe("invalid")
      expect(refused.message).toContain(`schema is at migration ${Migrator.latest + 1}, newer than this build's ${Migrator.latest}`)
      // nothing ran, nothing was recorded
      expect((yield* sql<{ n: number }>`SELECT count(*) AS n FROM ${sql(Migrator.table)}`).map((r) => Number(r.n))).toEqual([Migrator.latest + 1])
    })

  it.live("postgres: a database whose schema is newer than this build's is refused, not served", () => withPg(newer("pg", PgStore.migrate)))
  it.live("sqlite: a database whose schema is newer than this build's is refused, not served", () => withSqlite(newer("sqlite", SqliteStore.migrate)))

  it.live("a store opened on an already migrated database migrates nothing and works", () =>
    withSqlite(
      Effect.gen(function* () {
        yield* SqliteStore.migrate
        const store = yield* SqliteStore.make
        expect(yield* store.countTargets()).toEqual([])
      })
    ))
})
