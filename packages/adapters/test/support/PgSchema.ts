import { randomBytes } from "node:crypto"
import type { Errors, FindingStore, Operations, Store } from "@scanfleet/core"
import { Effect, Layer, Redacted } from "effect"
import pg from "pg"
import * as PgStore from "../../src/PgStore.js"

const admin = (url: string, text: string) =>
  Effect.promise(async () => {
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    try {
      await client.query(text)
    } finally {
      await client.end()
    }
  })

/** The URL of a connection whose search_path is `schema`. */
export const urlFor = (url: string, schema: string) => {
  const u = new URL(url)
  u.searchParams.set("options", `-c search_path=${schema}`)
  return u.toString()
}

/** A fresh schema for one test, dropped when the scope closes. */
export const schema = (url: string) =>
  Effect.acquireRelease(
    Effect.gen(function* () {
      const name = `sf_${randomBytes(6).toString("hex")}`
      yield* admin(url, `CREATE SCHEMA ${name}`)
      return name
    }),
    (name) => admin(url, `DROP SCHEMA ${name} CASCADE`)
  )

/** A Postgres Store in a fresh schema of the test server, with its own pool. */
export const freshStore = (url: string, maxConnections = 12): Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore, Errors.StoreError> =>
  Layer.unwrapScoped(Effect.map(schema(url), (name) => PgStore.layer({ url: Redacted.make(urlFor(url, name)), maxConnections })))
