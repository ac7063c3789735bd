import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import pg from "pg"
import { inject } from "vitest"
import { Store } from "@scanfleet/core"
import * as PgStore from "../src/PgStore.js"
import * as SqliteStore from "../src/SqliteStore.js"
import { freshStore, schema, urlFor } from "./support/PgSchema.js"

// A StoreError, never the driver's SqlError, whatever goes wrong below the port.
const storeError = (e: unknown) => expect(e).toMatchObject({ _tag: "StoreError" })

describe("backend failures surface as core's StoreError", () => {
  it.live("postgres: an unreachable server fails the layer with reason unavailable", () =>
    Effect.gen(function* () {
      const e = yield* Effect.flip(Effect.provide(Store.Store, PgStore.layer({ url: Redacted.make("postgres://nobody:x@127.0.0.1:1/none"), connectTimeout: "2 seconds" })))
      storeError(e)
      expect(e.reason).toBe("unavailable")
    }))

  it.live("sqlite: a file that cannot be opened fails the layer with reason unavailable", () =>
    Effect.gen(function* () {
      const e = yield* Effect.flip(Effect.provide(Store.Store, SqliteStore.layer({ filename: "/nonexistent-directory/for/scanfleet.db" })))
      storeError(e)
      expect(e.reason).toBe("unavailable")
    }))

  it.live("postgres: a failing statement inside an operation is a StoreError", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const store = yield* Effect.provide(Store.Store, yield* Layer.build(PgStore.layer({ url: Redacted.make(urlFor(inject("pgUrl"), name)) })))
      yield* store.recordDurations([{ source: "github", metric: "upload", outcome: "clean", ms: 1, at: 1 }])
      yield* Effect.promise(async () => {
        const c = new pg.Client({ connectionString: urlFor(inject("pgUrl"), name) })
        await c.connect()
        await c.query("DROP TABLE durations")
        await c.end()
      })
      const e = yield* Effect.flip(store.percentiles({ from: 0, to: 10, minSamples: 1 }))
      storeError(e)
      expect(e.message).toContain("durations")
    }).pipe(Effect.scoped))

  it.live("postgres: a constraint violation is reason constraint", () =>
    Effect.gen(function* () {
      const store = yield* Store.Store
      const d = yield* store.addDevice({ name: "d", slots: 1, tokenHash: "h", now: 1 })
      // a slot count below zero breaks the devices table's check constraint
      const e = yield* Effect.flip(store.addDevice({ name: "bad", slots: -1, tokenHash: "h2", now: 1 }))
      storeError(e)
      expect(e.reason).toBe("constraint")
      expect(yield* store.deviceByTokenHash("h")).toEqual(d)
    }).pipe(Effect.provide(freshStore(inject("pgUrl")))))
})
