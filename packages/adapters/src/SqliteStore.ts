import { SqliteClient } from "@effect/sql-sqlite-node"
import type { SqlClient } from "@effect/sql"
import { type Config, Effect, Layer } from "effect"
import { Errors, type FindingStore, Store } from "@scanfleet/core"
import * as SqlFindingStore from "./SqlFindingStore.js"
import * as Migrate from "./internal/Migrate.js"
import * as SqlStore from "./internal/SqlStore.js"
import { storeLayer } from "./internal/SqlErrors.js"

/** Brings the schema up to date (forward-only, idempotent). */
export const migrate: Effect.Effect<void, Errors.StoreError, SqlClient.SqlClient> = Migrate.run("sqlite")

/**
 * The SQLite Store over the SqlClient in context, after migrating its schema.
 *
 * @example
 * const store = yield* SqliteStore.make
 */
export const make: Effect.Effect<Store.StoreShape, Errors.StoreError, SqlClient.SqlClient> = Effect.zipRight(migrate, SqlStore.make)

/** The Store and its FindingStore over an existing SqlClient (a SQLite one), migrating first. */
export const layerFromClient: Layer.Layer<Store.Store | FindingStore.FindingStore, Errors.StoreError, SqlClient.SqlClient> = Layer.merge(Layer.effect(Store.Store, make), SqlFindingStore.layerFromClient)

const settingsError = (e: unknown) => new Errors.StoreError({ reason: "unavailable", message: `SQLite settings: ${String(e)}`, cause: e })

/**
 * The Store in one SQLite database file (WAL mode), created if missing.
 *
 * @example
 * const StoreLive = SqliteStore.layer({ filename: "./scanfleet.db" })
 */
export const layer = (config: SqliteClient.SqliteClientConfig): Layer.Layer<Store.Store | FindingStore.FindingStore, Errors.StoreError> =>
  storeLayer(Layer.provide(layerFromClient, Layer.mapError(SqliteClient.layer(config), settingsError)))

/** The Store with its settings read from Config (for example `{ filename: Config.string("SCANFLEET_DB") }`). */
export const layerConfig = (config: Config.Config.Wrap<SqliteClient.SqliteClientConfig>): Layer.Layer<Store.Store | FindingStore.FindingStore, Errors.StoreError> =>
  storeLayer(Layer.provide(layerFromClient, Layer.mapError(SqliteClient.layerConfig(config), settingsError)))
