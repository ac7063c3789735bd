import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { inject } from "vitest"
import { Store, type Target } from "@scanfleet/core"
import * as PgStore from "../src/PgStore.js"
import { countStatements } from "./support/Counting.js"
import { capturing } from "./support/PgCapture.js"
import { schema, urlFor } from "./support/PgSchema.js"
import { freshStore as freshSqlite } from "./support/TempSqlite.js"

const T0 = Date.UTC(2025, 0, 1)
const batch = (n: number, at: number): ReadonlyArray<Target.Observation> => Array.from({ length: n }, (_, i) => ({ source: "github", identity: `bulk/${i}`, remoteAt: at - i }))

describe("recording a batch of 10,000 observations costs O(1) round trips", () => {
  it.live("postgres: one query on the wire per batch, counted at the connection", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const wire = capturing(urlFor(inject("pgUrl"), name))
      const store = yield* Effect.provide(PgStore.make, yield* Layer.build(wire.layer))
      const before = wire.sent.length
      const first = yield* store.recordObservations(batch(10_000, T0), T0)
      expect(first.inserted).toHaveLength(10_000)
      expect(wire.sent.length - before).toBe(1)
      const again = yield* store.recordObservations(batch(10_000, T0 + 1000), T0 + 1)
      expect(again).toEqual({ inserted: [], known: 10_000 })
      expect(wire.sent.length - before).toBe(2)
    }).pipe(Effect.scoped))

  it.live("sqlite: a constant number of statements in one transaction, whatever the batch size", () =>
    Effect.gen(function* () {
      const store = yield* Store.Store
      const small = yield* countStatements(store.recordObservations(batch(10, T0), T0))
      const large = yield* countStatements(store.recordObservations(batch(10_000, T0 + 1), T0 + 1))
      expect(large.value.inserted).toHaveLength(9_990)
      expect(large.statements).toBe(small.statements)
      // the write lock, the id watermark and the upsert
      expect(large.statements).toBe(3)
    }).pipe(Effect.provide(freshSqlite())))

  it.live("postgres through the tracer agrees: one statement per batch", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const store = yield* Effect.provide(PgStore.make, yield* Layer.build(PgStore.clientLayer({ url: Redacted.make(urlFor(inject("pgUrl"), name)) })))
      const r = yield* countStatements(store.recordObservations(batch(10_000, T0), T0))
      expect(r.statements).toBe(1)
    }).pipe(Effect.scoped))
})
