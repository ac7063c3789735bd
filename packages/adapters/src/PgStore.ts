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
  /**
   * How long PostgreSQL lets one statement of the store run, its lock waits included, before it
   * cancels it (a `StoreError` `unavailable`; a 503 at the server); `null`: no limit. Default
   * `defaultStatementTimeout`. A statement that has had no answer at all `answerMargin` after it
   * is taken as a lost connection: the connection is closed and the statement fails alike.
   * Migrations run on a connection of their own, without either limit.
   */
  readonly statementTimeout?: Duration.DurationInput | null
}

/** The store's statement timeout unless `PoolOptions.statementTimeout` says otherwise. */
export const defaultStatementTimeout = Duration.seconds(30)

/** How long past the statement timeout a statement without any answer waits before its connection is closed (a database that stopped answering). */
export const answerMargin = Duration.seconds(10)

/** How long a statement waits for a pooled connection (or a new one) unless `connectTimeout` says otherwise. */
export const defaultAcquireTimeout = Duration.seconds(5)

// The store's client class. A connection's error (PostgreSQL terminating its backend, a reset
// socket) is an 'error' event, and one with no listener kills the process. The pool listens while a
// connection is idle and the caller while it runs a statement, but a connection handed between the
// two (below) or left by a caller after its first error had none: a backend terminated just as its
// statement answered took the server down. Each client listens for its whole life; the error
// leaves it not queryable, so its next statement fails and the pool drops it on release.
//
// With `answerWithin`, a statement gives up when no answer comes within that many ms: the
// connection is closed, so its statement (and any queued behind it) fails and the pool drops it.
// Without this a database that stopped answering (a dead host, a black-holed network) held every
// request and the pool's connections until the kernel gave up on the sockets, many minutes later.
const clientClass = (Base: typeof Pg.Client, answerWithin: number | undefined): typeof Pg.Client =>
  class extends Base {
    constructor(...args: Array<any>) {
      super(...(args as [Pg.ClientConfig]))
      this.on("error", () => {})
    }
    override query(...args: Array<any>): any {
      const callback = args[args.length - 1]
      if (answerWithin === undefined || typeof callback !== "function") return (super.query as (...a: Array<any>) => any)(...args)
      const timer = setTimeout(() => {
        const stream = (this as unknown as { connection?: { stream?: { destroy: (e?: Error) => void } } }).connection?.stream
        stream?.destroy(new Error(`no answer from PostgreSQL within ${answerWithin} ms`))
      }, answerWithin)
      timer.unref()
      return (super.query as (...a: Array<any>) => any)(...args.slice(0, -1), (err: unknown, res: unknown) => {
        clearTimeout(timer)
        callback(err, res)
      })
    }
  }

// pg-pool hands a freed connection to the next waiter inside the release call, and a waiter whose
// caller has gone releases it at once, so a queue of them recursed until the stack overflowed (a
// stalled database, thousands of requests given up, then the database back: the process died).
// Each waiter is answered in a microtask of its own instead. The release can come from inside the
// socket's read, before the rest of what was read is parsed: a connection whose error arrives in
// that gap is dropped and the waiter asks again, rather than being handed a dead connection.
class Pool extends Pg.Pool {
  override connect(callback?: any): any {
    if (callback === undefined) return super.connect()
    return super.connect((err: Error | undefined, client: Pg.PoolClient | undefined, release: (e?: Error | boolean) => void) => {
      if (client === undefined) return queueMicrotask(() => callback(err, client, release))
      let failed: Error | undefined
      const onError = (e: Error) => (failed ??= e)
      client.on("error", onError)
      queueMicrotask(() => {
        client.off("error", onError)
        if (failed === undefined) return callback(err, client, release)
        release(failed)
        this.connect(callback)
      })
    })
  }
}

// The pool @effect/sql-pg would build from these settings, with scanfleet's client class.
const pool = (config: PgClient.PgClientConfig, options: PoolOptions) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: async () => {
        const timeout = options.statementTimeout === null ? undefined : Duration.toMillis(Duration.decode(options.statementTimeout ?? defaultStatementTimeout))
        const p = new Pool({
          connectionString: config.url ? Redacted.value(config.url) : undefined,
          user: config.username,
          host: config.host,
          database: config.database,
          password: config.password ? Redacted.value(config.password) : undefined,
          ssl: config.ssl,
          port: config.port,
          ...(config.stream ? { stream: config.stream } : {}),
          connectionTimeoutMillis: Duration.toMillis(config.connectTimeout ?? defaultAcquireTimeout),
          // dead peers found by the kernel's probes rather than never
          keepAlive: true,
          keepAliveInitialDelayMillis: 10_000,
          ...(timeout === undefined ? {} : { statement_timeout: timeout }),
          idleTimeoutMillis: config.idleTimeout ? Duration.toMillis(config.idleTimeout) : undefined,
          max: config.maxConnections,
          min: config.minConnections,
          maxLifetimeSeconds: config.connectionTTL ? Duration.toSeconds(config.connectionTTL) : undefined,
          application_name: config.applicationName ?? "scanfleet",
          types,
          Client: clientClass(options.prepare === false ? Pg.Client : PreparingClient, timeout === undefined ? undefined : timeout + Duration.toMillis(answerMargin))
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
  storeLayer(Layer.provide(layerFromClient, Layer.provide(clientLayer(config, options), migrated(config, options))))

// The migrations, on a connection of their own without the statement limits (an index built on a
// large table may take minutes), before the store's pool is opened.
const migrated = (config: PgClient.PgClientConfig, options: PoolOptions): Layer.Layer<never, Errors.StoreError> =>
  Layer.effectDiscard(Effect.scoped(Effect.flatMap(Layer.build(clientLayer({ ...config, maxConnections: 1, minConnections: 0 }, { ...options, statementTimeout: null })), (ctx) => Effect.provide(migrate, ctx))))

/** The Store with connection settings read from Config (for example `Config.redacted("DATABASE_URL")`). */
export const layerConfig = (config: Config.Config.Wrap<PgClient.PgClientConfig>, options: PoolOptions = {}): Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore, Errors.StoreError> =>
  storeLayer(Layer.provide(
    layerFromClient,
    Layer.unwrapEffect(
      Effect.mapBoth(Config.unwrap(config), {
        onFailure: (e) => new Errors.StoreError({ reason: "unavailable", message: `Postgres settings: ${String(e)}`, cause: e }),
        onSuccess: (c) => Layer.provide(clientLayer(c, options), migrated(c, options))
      })
    )
  ))
