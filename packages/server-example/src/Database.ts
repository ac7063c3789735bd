import { Database } from "@scanfleet/adapters"
import type { Errors, FindingStore, Operations, Store } from "@scanfleet/core"
import type { Layer } from "effect"
import type { ServerConfig } from "./ServerConfig.js"

// The database URL rules live in @scanfleet/adapters (the Promise API reads the same URLs);
// the server keeps its own names for them.

/** Which backend a database URL names. */
export type Backend = Database.Backend

/** Reads a database URL; throws `DatabaseUrlError` for a scheme scanfleet has no backend for. */
export const parse: (url: string) => Backend = Database.parse

/** Why a database URL is refused, or `null`. */
export const check: (url: string) => Database.DatabaseUrlError | null = Database.check

/** The URL with any password hidden, for logs. */
export const redact: (url: string) => string = Database.redact

/**
 * The Store a database URL names, with its operator port and its FindingStore, migrated to the latest schema. Releasing
 * the layer closes the connection pool.
 *
 * @example
 * const StoreLive = Database.layer("sqlite:./data/scanfleet.db", { poolSize: 10 })
 */
export const layer: (url: string, opts?: Database.LayerOptions) => Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore, Errors.StoreError> = Database.layer

/** The store options a server's settings give. */
export const optionsOf = (config: Pick<ServerConfig, "poolSize" | "pgPrepare" | "pgStatementTimeoutMs">): Database.LayerOptions => ({
  poolSize: config.poolSize,
  prepare: config.pgPrepare,
  statementTimeoutMs: config.pgStatementTimeoutMs
})
