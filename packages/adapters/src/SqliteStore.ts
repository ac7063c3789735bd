import * as Reactivity from "@effect/experimental/Reactivity"
import { SqlClient, type SqlError } from "@effect/sql"
import { Config, Context, Effect, Layer } from "effect"
import { Errors, type FindingStore, type Operations, Store } from "@scanfleet/core"
import * as SqlFindingStore from "./SqlFindingStore.js"
import * as SqlOperations from "./SqlOperations.js"
import * as Migrate from "./internal/Migrate.js"
import { storeLayer, toStoreError } from "./internal/SqlErrors.js"
import * as SqlStore from "./internal/SqlStore.js"
import * as Connection from "./internal/sqlite/Connection.js"
import * as Hot from "./internal/sqlite/Hot.js"

/** How the database file is opened: its path, and how long a write waits for another process's lock. */
export type Options = Connection.Options

/**
 * The open database file behind a SQLite Store, for the statements that run as
 * prepared better-sqlite3 statements (the `SqlClient` of the same layer shares it).
 */
export class Database extends Context.Tag("@scanfleet/adapters/SqliteStore/Database")<Database, Connection.Database>() {}

/** Brings the schema up to date (forward-only, idempotent). */
export const migrate: Effect.Effect<void, Errors.StoreError, SqlClient.SqlClient> = Migrate.run("sqlite")

/**
 * The SQLite Store over the database in context, after migrating its schema. The
 * hot operations (claims, results, progress, observations) run as prepared
 * statements in synchronous transactions; the rest through the SqlClient.
 *
 * @example
 * const store = yield* SqliteStore.make
 */
export const make: Effect.Effect<Store.StoreShape, Errors.StoreError, SqlClient.SqlClient | Database> = Effect.gen(function* () {
  yield* migrate
  const base = yield* SqlStore.make
  const database = yield* Database
  const hot = yield* Effect.try({ try: () => Hot.make(database, base), catch: (e) => new Errors.StoreError({ reason: "internal", message: `preparing the SQLite statements: ${String(e)}`, cause: e }) })
  return { ...base, ...hot }
})

/** The Store, the operator port and the FindingStore over a database opened by `clientLayer` (or its own), migrating first. */
export const layerFromClient: Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore, Errors.StoreError, SqlClient.SqlClient | Database> = Layer.mergeAll(
  Layer.effect(Store.Store, make),
  SqlOperations.layerFromClient,
  SqlFindingStore.layerFromClient
)

// A file that cannot be opened (a missing directory is a TypeError in better-sqlite3) is unavailable, not a defect.
const openingError = (e: SqlError.SqlError): Errors.StoreError => {
  const mapped = toStoreError(e)
  return mapped.reason === "internal" ? new Errors.StoreError({ reason: "unavailable", message: mapped.message, cause: mapped.cause }) : mapped
}

/**
 * The database file as a `SqlClient` and a `Database`, one connection in WAL mode,
 * created if missing: for a Store and for any other port that shares the file.
 */
export const clientLayer = (options: Options): Layer.Layer<SqlClient.SqlClient | Database, Errors.StoreError> =>
  Layer.scopedContext(
    Effect.map(Effect.mapError(Connection.make(options), openingError), ({ client, database }) => Context.make(SqlClient.SqlClient, client).pipe(Context.add(Database, database)))
  ).pipe(Layer.provide(Reactivity.layer))

/**
 * The Store in one SQLite database file (WAL mode), created if missing; the layer
 * also provides the file's `SqlClient` for other ports.
 *
 * @example
 * const StoreLive = SqliteStore.layer({ filename: "./scanfleet.db" })
 */
export const layer = (options: Options): Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore | SqlClient.SqlClient | Database, Errors.StoreError> =>
  storeLayer(Layer.provideMerge(layerFromClient, clientLayer(options)))

/** The Store with its settings read from Config (for example `{ filename: Config.string("SCANFLEET_DB") }`). */
export const layerConfig = (config: Config.Config.Wrap<Options>): Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore | SqlClient.SqlClient | Database, Errors.StoreError> =>
  Layer.unwrapEffect(
    Effect.map(
      Effect.mapError(Config.unwrap(config), (e) => new Errors.StoreError({ reason: "unavailable", message: `SQLite settings: ${String(e)}`, cause: e })),
      layer
    )
  )
