import { PgClient } from "@effect/sql-pg"
import type { SqlClient } from "@effect/sql"
import { Config, Effect, Layer } from "effect"
import * as Pg from "pg"
import { Errors, Store } from "@scanfleet/core"
import * as Migrate from "./internal/Migrate.js"
import * as SqlStore from "./internal/SqlStore.js"
import { storeLayer, toStoreError } from "./internal/SqlErrors.js"

const INT8 = 20

/**
 * Type parsing for scanfleet's Postgres connections: BIGINT columns (epoch
 * milliseconds, counts) come back as JS numbers, not strings. Every value
 * scanfleet stores in one stays far below 2^53.
 */
export const types: Pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: string) =>
    oid === INT8 && format !== "binary" ? (v: string) => Number(v) : Pg.types.getTypeParser(oid, format as "text")) as Pg.CustomTypesConfig["getTypeParser"]
}

/** A PgClient layer configured the way the store expects (BIGINT as numbers). */
export const clientLayer = (config: PgClient.PgClientConfig): Layer.Layer<PgClient.PgClient | SqlClient.SqlClient, Errors.StoreError> =>
  Layer.mapError(PgClient.layer({ ...config, types }), toStoreError)

/** Brings the schema up to date (forward-only, idempotent; concurrent servers wait on a table lock). */
export const migrate: Effect.Effect<void, Errors.StoreError, SqlClient.SqlClient> = Migrate.run("pg")

/**
 * The Postgres Store over the SqlClient in context, after migrating its schema.
 *
 * @example
 * const store = yield* PgStore.make
 */
export const make: Effect.Effect<Store.StoreShape, Errors.StoreError, SqlClient.SqlClient> = Effect.zipRight(migrate, SqlStore.make)

/** The Store over an existing SqlClient (a Postgres one), migrating first. */
export const layerFromClient: Layer.Layer<Store.Store, Errors.StoreError, SqlClient.SqlClient> = Layer.effect(Store.Store, make)

/**
 * The Store with its own connection pool.
 *
 * @example
 * const StoreLive = PgStore.layer({ url: Redacted.make(process.env.DATABASE_URL!), maxConnections: 20 })
 */
export const layer = (config: PgClient.PgClientConfig): Layer.Layer<Store.Store, Errors.StoreError> =>
  storeLayer(Layer.provide(layerFromClient, clientLayer(config)))

/** The Store with connection settings read from Config (for example `Config.redacted("DATABASE_URL")`). */
export const layerConfig = (config: Config.Config.Wrap<PgClient.PgClientConfig>): Layer.Layer<Store.Store, Errors.StoreError> =>
  storeLayer(Layer.provide(
    layerFromClient,
    Layer.mapError(PgClient.layerConfig({ ...config, types: Config.succeed(types) } as Config.Config.Wrap<PgClient.PgClientConfig>), (e) =>
      e._tag === "SqlError" ? toStoreError(e) : new Errors.StoreError({ reason: "unavailable", message: `Postgres settings: ${String(e)}`, cause: e })
    )
  ))
