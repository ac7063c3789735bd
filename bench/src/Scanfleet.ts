/**
 * scanfleet as a user gets it: the built packages (`npm run build` emits
 * packages/<name>/dist), resolved through the workspace links of the repository
 * root, driven through core's Store port with Effect, exactly as the server does.
 */
import { Effect, Layer, ManagedRuntime, Redacted } from "effect"
import { Config, Store } from "@scanfleet/core"

type StoreShape = Store.StoreShape

/** A live store: run an effect against it, then close it. */
export interface Handle {
  readonly run: <A, E>(f: (s: StoreShape) => Effect.Effect<A, E>) => Promise<A>
  readonly close: () => Promise<void>
}

/** The configuration a fresh fleet starts with (core's defaults). */
export const config = Config.defaults

const fromLayer = (layer: Layer.Layer<Store.Store, unknown, never>): Handle => {
  const rt = ManagedRuntime.make(layer)
  return {
    run: (f) => rt.runPromise(Effect.flatMap(Store.Store, f)),
    close: () => rt.dispose()
  }
}

// The adapters package is loaded lazily so that the alternatives can be
// measured even while a build of scanfleet's adapters is missing.
const adapters = async (): Promise<Record<string, any>> => {
  try {
    // a specifier in a variable: typed as `any`, so this file typechecks with or without the adapters' declarations
    const specifier: string = "@scanfleet/adapters"
    return (await import(specifier)) as Record<string, any>
  } catch (e) {
    throw new Error(`@scanfleet/adapters could not be loaded (run \`npm run build\` at the root first): ${(e as Error).message}`)
  }
}

/** Why scanfleet's Postgres store cannot be measured in this checkout, or null when it can. */
export const pgMissing = async (): Promise<string | null> => {
  try {
    const a = await adapters()
    return a.PgStore ? null : "this build of @scanfleet/adapters exports no PgStore yet"
  } catch (e) {
    return (e as Error).message
  }
}

/** Why scanfleet's SQLite store cannot be measured, or null when it can. */
export const sqliteMissing = async (): Promise<string | null> => {
  try {
    const a = await adapters()
    return a.SqliteStore ? null : "this build of @scanfleet/adapters exports no SqliteStore yet"
  } catch (e) {
    return (e as Error).message
  }
}

/** Opens scanfleet's PostgreSQL store on a database URL with a pool of `maxConnections`. */
export const openPg = async (url: string, maxConnections: number): Promise<Handle> => {
  const a = await adapters()
  if (!a.PgStore) throw new Error("no PgStore in @scanfleet/adapters")
  const h = fromLayer(a.PgStore.layer({ url: Redacted.make(url), maxConnections }))
  await h.run(() => Effect.void) // builds the layer: connects and migrates outside the measured section
  // A diagnosis, never a result: statements run on scanfleet's database after its migrations, to
  // price a schema change (dropping an index or a check, say) before writing it as a migration.
  const extra = process.env.BENCH_SCHEMA_SQL
  if (extra) {
    const c = new (await import("pg")).default.Client({ connectionString: url })
    await c.connect()
    try {
      await c.query(extra)
    } finally {
      await c.end()
    }
  }
  return h
}

/** Opens scanfleet's SQLite store on a file. */
export const openSqlite = async (filename: string): Promise<Handle> => {
  const a = await adapters()
  if (!a.SqliteStore) throw new Error("no SqliteStore in @scanfleet/adapters")
  const h = fromLayer(a.SqliteStore.layer({ filename }))
  await h.run(() => Effect.void)
  return h
}
