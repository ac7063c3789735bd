import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Fiber, Layer, Redacted } from "effect"
import { inject } from "vitest"
import * as PgStore from "../src/PgStore.js"

describe("the PostgreSQL store's pool", () => {
  it.live("thousands of callers who gave up while waiting for a connection are passed over one by one when it frees, without deepening the stack", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const ctx = yield* Layer.build(PgStore.clientLayer({ url: Redacted.make(inject("pgUrl")), maxConnections: 1, connectTimeout: Duration.minutes(1) }))
        const sql = Effect.provide(Effect.flatMap(SqlClient.SqlClient, (s) => s<{ x: number }>`SELECT 1 AS x`), ctx)
        // The one connection, held by a transaction until the end of the test's waiting.
        const holding = yield* Effect.fork(Effect.provide(Effect.flatMap(SqlClient.SqlClient, (s) => s.withTransaction(Effect.zipRight(s`SELECT 1`, Effect.never))), ctx))
        yield* Effect.sleep("200 millis")
        // Callers queue for a connection, then give up (a request whose client went away).
        const waiting = yield* Effect.forEach(Array.from({ length: 6_000 }), () => Effect.fork(sql))
        yield* Effect.sleep("500 millis")
        yield* Effect.forEach(waiting, Fiber.interrupt, { concurrency: "unbounded", discard: true })
        // The connection frees: each waiter that gave up hands it on. Before, each did so inside
        // the release call of the one before it, and the stack overflowed.
        yield* Fiber.interrupt(holding)
        expect(yield* sql.pipe(Effect.timeout("20 seconds"))).toEqual([{ x: 1 }])
      })
    ), 60_000)
})
