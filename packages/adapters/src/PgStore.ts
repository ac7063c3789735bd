import { PgClient } from "@effect/sql-pg"
import type { SqlClient } from "@effect/sql"
import { SqlError } from "@effect/sql"
import { Config, Context, Duration, Effect, Layer, Redacted } from "effect"
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
// Each client is in `open` from its creation to its end, so closing the pool can cut those still
// busy (`close`).
//
// With `answerWithin`, a statement gives up when no answer comes within that many ms: the
// connection is closed, so its statement (and any queued behind it) fails and the pool drops it.
// Without this a database that stopped answering (a dead host, a black-holed network) held every
// request and the pool's connections until the kernel gave up on the sockets, many minutes later.
const clientClass = (Base: typeof Pg.Client, answerWithin: number | undefined, open: Set<Pg.Client>): typeof Pg.Client =>
  class extends Base {
    constructor(...args: Array<any>) {
      super(...(args as [Pg.ClientConfig]))
      this.on("error", () => {})
      open.add(this)
      this.once("end", () => open.delete(this))
    }
    override query(...args: Array<any>): any {
      const callback = args[args.length - 1]
      if (answerWithin === undefined || typeof callback !== "function") return (super.query as (...a: Array<any>) => any)(...args)
      const timer = setTimeout(() => {
        cut(this, new Error(`no answer from PostgreSQL within ${answerWithin} ms`))
      }, answerWithin)
      timer.unref()
      return (super.query as (...a: Array<any>) => any)(...args.slice(0, -1), (err: unknown, res: unknown) => {
        clearTimeout(timer)
        callback(err, res)
      })
    }
  }

// Closes a connection's socket at once: its statement in flight (and any queued behind it) fails.
const cut = (client: Pg.Client, reason: Error) =>
  (client as unknown as { connection?: { stream?: { destroy: (e?: Error) => void } } }).connection?.stream?.destroy(reason)

/** How long closing the pool waits for the connections still busy (statements of work the server left at its deadline) before it cuts them. */
export const closeWait = Duration.seconds(1)

// pg-pool's `end` waits for every busy connection to be given back, and a statement on a connection
// to a database that stopped answering is given back only when the answer margin cuts it, or never
// without a statement timeout: the process could not exit. Past `closeWait` those connections are
// cut, and said so.
const close = (p: Pool, open: ReadonlySet<Pg.Client>) =>
  Effect.gen(function* () {
    // A finalizer runs uninterruptibly, and a timeout can only end what it can interrupt.
    const ended = yield* Effect.promise(() => p.end()).pipe(Effect.interruptible, Effect.timeoutOption(closeWait))
    if (ended._tag === "Some" || open.size === 0) return
    yield* Effect.logWarning("closing the PostgreSQL pool: connections still busy were cut").pipe(
      Effect.annotateLogs({ busyConnections: open.size, waitedMs: Duration.toMillis(closeWait) })
    )
    for (const c of open) cut(c, new Error("the pool was closed"))
  })

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
const pool = (config: PgClient.PgClientConfig, options: PoolOptions, open: Set<Pg.Client>) =>
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
          Client: clientClass(options.prepare === false ? Pg.Client : PreparingClient, timeout === undefined ? undefined : timeout + Duration.toMillis(answerMargin), open)
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
    (p) => close(p, open)
  )

/** How the store's pool stands, for a readiness probe. */
export interface PoolUsage {
  /** Connections handed out to statements (or opening for one). */
  readonly inUse: number
  /** The most connections the pool opens. */
  readonly max: number
  /** Callers waiting for a connection. */
  readonly waiting: number
  /** Every connection the pool may open is in use: a statement now waits for one to be given back. */
  readonly saturated: boolean
}

/**
 * What the store's own pool knows beyond its statements, for a readiness probe: a probe's
 * statement waits behind the pool's callers, so with every connection in use it cannot tell a
 * busy database from one that does not answer; `ask` can, on a connection of its own.
 */
export class PoolProbe extends Context.Tag("@scanfleet/adapters/PgStore/PoolProbe")<
  PoolProbe,
  {
    /** The pool's connections now. */
    readonly usage: Effect.Effect<PoolUsage>
    /** `SELECT 1` on a new connection outside the pool, closed after; fails `unavailable`, saying why, without an answer within `timeout`. */
    readonly ask: (timeout: Duration.DurationInput) => Effect.Effect<void, Errors.StoreError>
  }
>() {}

const usageOf = (p: Pool): PoolUsage => {
  const inUse = p.totalCount - p.idleCount
  const max = p.options.max ?? 10
  return { inUse, max, waiting: p.waitingCount, saturated: inUse >= max }
}

// A plain client with the pool's settings (pg-pool makes its clients from the same options), bounded
// by `timeout` for the connection and again for the statement.
const ask = (p: Pool, timeout: Duration.DurationInput): Effect.Effect<void, Errors.StoreError> => {
  const ms = Duration.toMillis(Duration.decode(timeout))
  return Effect.acquireUseRelease(
    Effect.sync(() => new Pg.Client({ ...p.options, connectionTimeoutMillis: ms, query_timeout: ms }).on("error", () => {})),
    (c) => Effect.tryPromise(async () => void (await c.connect(), await c.query("SELECT 1"))),
    (c) => Effect.sync(() => void c.end().catch(() => {}))
  ).pipe(Effect.mapError((e) => toStoreError(new SqlError.SqlError({ cause: e.error, message: "PostgreSQL did not answer a connection of its own" }))))
}

const probeOf = (p: Pool): Context.Tag.Service<PoolProbe> => ({ usage: Effect.sync(() => usageOf(p)), ask: (timeout) => ask(p, timeout) })

/** A PgClient layer configured the way the store expects (BIGINT as numbers; hot statements prepared unless `prepare: false`), with its pool's `PoolProbe`. */
export const clientLayer = (config: PgClient.PgClientConfig, options: PoolOptions = {}): Layer.Layer<PgClient.PgClient | SqlClient.SqlClient | PoolProbe, Errors.StoreError> =>
  Layer.mapError(
    Layer.unwrapScoped(
      Effect.map(pool(config, options, new Set()), (p) =>
        Layer.merge(
          PgClient.layerFromPool({
            acquire: Effect.succeed(p),
            applicationName: config.applicationName,
            spanAttributes: config.spanAttributes,
            transformResultNames: config.transformResultNames,
            transformQueryNames: config.transformQueryNames,
            transformJson: config.transformJson,
            types
          }),
          Layer.succeed(PoolProbe, probeOf(p))
        )
      )
    ),
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

// The stores over the pool of `client`, with the pool's probe.
const over = (client: Layer.Layer<SqlClient.SqlClient | PoolProbe, Errors.StoreError>) =>
  storeLayer(Layer.provide(Layer.merge(layerFromClient, Layer.effect(PoolProbe, PoolProbe)), client))

/**
 * The Store with its own connection pool, and the pool's `PoolProbe`.
 *
 * @example
 * const StoreLive = PgStore.layer({ url: Redacted.make(process.env.DATABASE_URL!), maxConnections: 20 })
 */
export const layer = (config: PgClient.PgClientConfig, options: PoolOptions = {}): Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore | PoolProbe, Errors.StoreError> =>
  over(Layer.provide(clientLayer(config, options), migrated(config, options)))

// The migrations, on a connection of their own without the statement limits (an index built on a
// large table may take minutes), before the store's pool is opened.
const migrated = (config: PgClient.PgClientConfig, options: PoolOptions): Layer.Layer<never, Errors.StoreError> =>
  Layer.effectDiscard(Effect.scoped(Effect.flatMap(Layer.build(clientLayer({ ...config, maxConnections: 1, minConnections: 0 }, { ...options, statementTimeout: null })), (ctx) => Effect.provide(migrate, ctx))))

/** The Store with connection settings read from Config (for example `Config.redacted("DATABASE_URL")`), and the pool's `PoolProbe`. */
export const layerConfig = (config: Config.Config.Wrap<PgClient.PgClientConfig>, options: PoolOptions = {}): Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore | PoolProbe, Errors.StoreError> =>
  over(
    Layer.unwrapEffect(
      Effect.mapBoth(Config.unwrap(config), {
        onFailure: (e) => new Errors.StoreError({ reason: "unavailable", message: `Postgres settings: ${String(e)}`, cause: e }),
        onSuccess: (c) => Layer.provide(clientLayer(c, options), migrated(c, options))
      })
    )
  )
