import { PgClient } from "@effect/sql-pg"
import type { SqlClient } from "@effect/sql"
import { SqlError } from "@effect/sql"
import { Config, Duration, Effect, Layer, Redacted } from "effect"
import * as Pg from "pg"
import { Errors, type FindingStore, type Operations, Store } from "@scanfleet/core"
import * as SqlFindingStore from "./SqlFindingStore.js"
import * as SqlOperations from "./SqlOperations.js"
import * as Migrate from "./internal/Migrate.js"
import { PreparingClient } from "./internal/PreparingClient.js"
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

/** Options of the store's own connection pool. */
export interface PoolOptions {
  /**
   * Run the hot statements (claim, result, progress) as named prepared statements,
   * parsed and planned once per connection (default true). Turn it off behind a
   * connection pooler that cannot carry prepared statements across transactions.
   */
  readonly prepare?: boolean
}

// The pool @effect/sql-pg would build from these settings, with scanfleet's client class.
const pool = (config: PgClient.PgClientConfig, options: PoolOptions) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: async () => {
        const p = new Pg.Pool({
          connectionString: config.url ? Redacted.value(config.url) : undefined,
          user: config.username,
          host: config.host,
          database: config.database,
          password: config.password ? Redacted.value(config.password) : undefined,
          ssl: config.ssl,
          port: config.port,
          ...(config.stream ? { stream: config.stream } : {}),
          connectionTimeoutMillis: config.connectTimeout ? Duration.toMillis(config.connectTimeout) : undefined,
          idleTimeoutMillis: config.idleTimeout ? Duration.toMillis(config.idleTimeout) : undefined,
          max: config.maxConnections,
          min: config.minConnections,
          maxLifetimeSeconds: config.connectionTTL ? Duration.toSeconds(config.connectionTTL) : undefined,
          application_name: config.applicationName ?? "scanfleet",
          types,
          ...(options.prepare === false ? {} : { Client: PreparingClient })
        })
        p.on("error", () => {})
        try {
          await p.query("SELECT 1")
        } catch (cause) {
          await p.end().catch(() => {})
          throw cause
        }
        return p
      },
      catch: (cause) => new SqlError.SqlError({ cause, message: "PgClient: Failed to connect" })
    }).pipe(
      Effect.timeoutFail({
        duration: config.connectTimeout ?? Duration.seconds(5),
        onTimeout: () => new SqlError.SqlError({ cause: new Error("Connection timed out"), message: "PgClient: Connection timed out" })
      })
    ),
    (p) => Effect.promise(() => p.end()).pipe(Effect.timeoutOption(1000))
  )

/** A PgClient layer configured the way the store expects (BIGINT as numbers; hot statements prepared unless `prepare: false`). */
export const clientLayer = (config: PgClient.PgClientConfig, options: PoolOptions = {}): Layer.Layer<PgClient.PgClient | SqlClient.SqlClient, Errors.StoreError> =>
  Layer.mapError(
    PgClient.layerFromPool({
      acquire: pool(config, options),
      applicationName: config.applicationName,
      spanAttributes: config.spanAttributes,
      transformResultNames: config.transformResultNames,
      transformQueryNames: config.transformQueryNames,
      transformJson: config.transformJson,
      types
    }),
    toStoreError
  )

/** Brings the schema up to date (forward-only, idempotent; concurrent servers wait on a table lock). */
export const migrate: Effect.Effect<void, Errors.StoreError, SqlClient.SqlClient> = Migrate.run("pg")

/**
 * The Postgres Store over the SqlClient in context, after migrating its schema.
 *
 * @example
 * const store = yield* PgStore.make
 */
export const make: Effect.Effect<Store.StoreShape, Errors.StoreError, SqlClient.SqlClient> = Effect.zipRight(migrate, SqlStore.make)

/** The Store, the operator port and the FindingStore over an existing SqlClient (a Postgres one), migrating first. */
export const layerFromClient: Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore, Errors.StoreError, SqlClient.SqlClient> = Layer.mergeAll(
  Layer.effect(Store.Store, make),
  SqlOperations.layerFromClient,
  SqlFindingStore.layerFromClient
)

/**
 * The Store with its own connection pool.
 *
 * @example
 * const StoreLive = PgStore.layer({ url: Redacted.make(process.env.DATABASE_URL!), maxConnections: 20 })
 */
export const layer = (config: PgClient.PgClientConfig, options: PoolOptions = {}): Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore, Errors.StoreError> =>
  storeLayer(Layer.provide(layerFromClient, clientLayer(config, options)))

/** The Store with connection settings read from Config (for example `Config.redacted("DATABASE_URL")`). */
export const layerConfig = (config: Config.Config.Wrap<PgClient.PgClientConfig>, options: PoolOptions = {}): Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore, Errors.StoreError> =>
  storeLayer(Layer.provide(
    layerFromClient,
    Layer.unwrapEffect(
      Effect.mapBoth(Config.unwrap(config), {
        onFailure: (e) => new Errors.StoreError({ reason: "unavailable", message: `Postgres settings: ${String(e)}`, cause: e }),
        onSuccess: (c) => clientLayer(c, options)
      })
    )
  ))
