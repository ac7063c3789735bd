import { PgStore, SqliteStore } from "@scanfleet/adapters"
import { type Errors, FindingStore, type Operations, type Store } from "@scanfleet/core"
import { Layer, Redacted } from "effect"
import { mkdirSync } from "node:fs"
import { dirname, resolve } from "node:path"

/** Which backend a database URL names. */
export type Backend = { readonly _tag: "memory" } | { readonly _tag: "sqlite"; readonly filename: string } | { readonly _tag: "postgres"; readonly url: string }

/**
 * Reads a database URL: `postgres://…` or `postgresql://…` is PostgreSQL;
 * `memory:` keeps everything in this process; `sqlite:<path>`, `file:<path>`
 * or a plain path is a SQLite file.
 */
export const parse = (url: string): Backend => {
  if (/^postgres(ql)?:\/\//i.test(url)) return { _tag: "postgres", url }
  if (url === "memory:" || url === ":memory:") return { _tag: "memory" }
  const path = url.replace(/^(sqlite|file):(\/\/)?/i, "")
  return { _tag: "sqlite", filename: resolve(path) }
}

/** The URL with any password hidden, for logs. */
export const redact = (url: string): string => url.replace(/\/\/([^:/@]+):[^@/]*@/, "//$1:***@")

/**
 * The Store a database URL names, with its operator port and its FindingStore, migrated to the latest schema. Releasing
 * the layer closes the connection pool.
 *
 * @example
 * const StoreLive = Database.layer("sqlite:./data/scanfleet.db", { poolSize: 10 })
 */
export const layer = (url: string, opts: { readonly poolSize?: number; readonly prepare?: boolean } = {}): Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore, Errors.StoreError> => {
  const b = parse(url)
  switch (b._tag) {
    case "memory":
      return FindingStore.layerMemory
    case "postgres":
      return PgStore.layer({ url: Redacted.make(b.url), maxConnections: opts.poolSize ?? 10 }, { prepare: opts.prepare ?? true })
    case "sqlite":
      return Layer.suspend(() => {
        mkdirSync(dirname(b.filename), { recursive: true })
        return SqliteStore.layer({ filename: b.filename })
      })
  }
}
