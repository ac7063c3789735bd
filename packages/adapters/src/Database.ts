import { type Errors, FindingStore, type Operations, type Store } from "@scanfleet/core"
import { Data, Duration, Layer, Redacted } from "effect"
import { mkdirSync } from "node:fs"
import { dirname, resolve } from "node:path"
import * as SqlErrors from "./internal/SqlErrors.js"
import * as PgStore from "./PgStore.js"
import * as SqliteStore from "./SqliteStore.js"

/** Which backend a database URL names. */
export type Backend = { readonly _tag: "memory" } | { readonly _tag: "sqlite"; readonly filename: string } | { readonly _tag: "postgres"; readonly url: string }

/** A database URL naming no backend scanfleet has (`mysql://…`), or nothing at all. */
export class DatabaseUrlError extends Data.TaggedError("DatabaseUrlError")<{
  readonly reason: "unsupported_scheme" | "empty"
  readonly url: string
  readonly message: string
}> {}

/** What a database URL may look like, for help texts and refusals. */
export const accepted = "sqlite:<path> or a plain path (SQLite), postgres://… or postgresql://… (PostgreSQL), memory: (nothing persists)"

/**
 * Why a database URL is refused, or `null` when it names a backend. A URL
 * with any other scheme is refused rather than read as a file name.
 */
export const check = (url: string): DatabaseUrlError | null => {
  if (url.trim() === "") return new DatabaseUrlError({ reason: "empty", url, message: `the database URL is empty; use ${accepted}` })
  const scheme = /^([a-z][a-z0-9+.-]*):/i.exec(url)?.[1]?.toLowerCase()
  // One letter before a colon is a Windows drive, so a plain path.
  if (scheme === undefined || scheme.length === 1 || ["sqlite", "file", "memory", "postgres", "postgresql"].includes(scheme)) {
    if ((scheme === "postgres" || scheme === "postgresql") && !/^postgres(ql)?:\/\//i.test(url))
      return new DatabaseUrlError({ reason: "unsupported_scheme", url: redact(url), message: `${redact(url)} is not a PostgreSQL URL; write postgres://user:password@host:5432/database` })
    return null
  }
  return new DatabaseUrlError({ reason: "unsupported_scheme", url: redact(url), message: `unsupported database URL scheme "${scheme}:" in ${redact(url)}; use ${accepted}` })
}

/**
 * Reads a database URL: `postgres://…` or `postgresql://…` is PostgreSQL;
 * `memory:` keeps everything in this process; `sqlite:<path>`, `file:<path>`
 * or a plain path is a SQLite file. Throws `DatabaseUrlError` for any other scheme.
 */
export const parse = (url: string): Backend => {
  const refused = check(url)
  if (refused) throw refused
  if (/^postgres(ql)?:\/\//i.test(url)) return { _tag: "postgres", url }
  if (url === "memory:" || url === ":memory:") return { _tag: "memory" }
  const path = url.replace(/^(sqlite|file):(\/\/)?/i, "")
  return { _tag: "sqlite", filename: resolve(path) }
}

/** Whether the store refused a write because its database is read-only (a PostgreSQL standby or `default_transaction_read_only`, a SQLite file without write access); such an error's reason is `unavailable`. */
export const isReadOnly = (e: Errors.StoreError): boolean => e.reason === "unavailable" && SqlErrors.isReadOnly(e.cause)

/** The URL with any password hidden, for logs. */
export const redact = (url: string): string => url.replace(/\/\/([^:/@]+):[^@/]*@/, "//$1:***@")

/** Options of `layer`; the PostgreSQL ones are ignored for SQLite and memory. */
export interface LayerOptions {
  /** PostgreSQL connections (default 10). */
  readonly poolSize?: number
  /** PostgreSQL: the hot statements as prepared statements (default true). */
  readonly prepare?: boolean
  /** PostgreSQL: `PgStore.PoolOptions.statementTimeout` in milliseconds, 0 for none (default `PgStore.defaultStatementTimeout`). */
  readonly statementTimeoutMs?: number
}

/**
 * The Store a database URL names, with its operator port and its FindingStore, migrated to the latest schema (on
 * PostgreSQL also the pool's `PgStore.PoolProbe`, read with `Effect.serviceOption`). Releasing
 * the layer closes the connection pool. A URL `check` refuses is a defect:
 * validate settings before building layers.
 *
 * @example
 * const StoreLive = Database.layer("sqlite:./data/scanfleet.db", { poolSize: 10 })
 */
export const layer = (url: string, opts: LayerOptions = {}): Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore, Errors.StoreError> =>
  Layer.suspend(() => {
    const b = parse(url)
    switch (b._tag) {
      case "memory":
        return FindingStore.layerMemory
      case "postgres":
        return PgStore.layer(
          { url: Redacted.make(b.url), maxConnections: opts.poolSize ?? 10 },
          { prepare: opts.prepare ?? true, ...(opts.statementTimeoutMs === undefined ? {} : { statementTimeout: opts.statementTimeoutMs === 0 ? null : Duration.millis(opts.statementTimeoutMs) }) }
        )
      case "sqlite":
        mkdirSync(dirname(b.filename), { recursive: true })
        return SqliteStore.layer({ filename: b.filename })
    }
  })
