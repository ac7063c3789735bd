import { PgClient } from "@effect/sql-pg"
import { Effect, Layer } from "effect"
import pg from "pg"
import * as PgStore from "../../src/PgStore.js"

/** One query as it went over the wire. */
export interface Sent {
  readonly text: string
  readonly values: ReadonlyArray<unknown>
}

/**
 * A PgClient whose pooled connections record every query they send, so a test
 * can count round trips or explain the exact statements the store ran.
 */
export const capturing = (url: string, max = 4) => {
  const sent: Array<Sent> = []
  const acquire = Effect.acquireRelease(
    Effect.sync(() => {
      const pool = new pg.Pool({ connectionString: url, max, types: PgStore.types })
      pool.on("connect", (client) => {
        const query = client.query.bind(client) as (...args: Array<unknown>) => unknown
        ;(client as unknown as { query: (...args: Array<unknown>) => unknown }).query = (...args) => {
          const [first, second] = args
          if (typeof first === "string") sent.push({ text: first, values: Array.isArray(second) ? second : [] })
          else if (first && typeof first === "object" && "text" in first) sent.push({ text: String((first as { text: unknown }).text), values: ((first as { values?: Array<unknown> }).values ?? []) })
          return query(...args)
        }
      })
      return pool
    }),
    (pool) => Effect.promise(() => pool.end())
  )
  return { sent, layer: PgClient.layerFromPool({ acquire }) as Layer.Layer<PgClient.PgClient | import("@effect/sql").SqlClient.SqlClient, import("@effect/sql").SqlError.SqlError> }
}
