import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Fiber, Layer, Redacted } from "effect"
import { connect, createServer, type Socket } from "node:net"
import { inject } from "vitest"
import * as PgStore from "../src/PgStore.js"

// PostgreSQL's ErrorResponse for a backend terminated by `pg_terminate_backend`.
const terminated = (() => {
  const fields = Buffer.from("SFATAL\0VFATAL\0C57P01\0Mterminating connection due to administrator command\0\0")
  const head = Buffer.alloc(5)
  head.write("E")
  head.writeInt32BE(fields.length + 4, 1)
  return Buffer.concat([head, fields])
})()

/**
 * A TCP proxy in front of PostgreSQL. Once armed, the next answer that ends a statement
 * (ReadyForQuery) reaches the client with the backend's termination behind it in the same read,
 * and the connection closes: a backend terminated just as its statement answered.
 */
const terminating = async (target: URL) => {
  let armed = false
  const links: Array<Socket> = []
  const server = createServer((client) => {
    const upstream = connect(Number(target.port || 5432), target.hostname)
    links.push(client, upstream)
    client.on("data", (d) => upstream.write(d))
    upstream.on("data", (d: Buffer) => {
      const ready = d.length >= 6 && d[d.length - 6] === 0x5a && d.readInt32BE(d.length - 5) === 5
      if (!(armed && ready)) return void client.write(d)
      armed = false
      client.end(Buffer.concat([d, terminated]))
      upstream.destroy()
    })
    const end = () => (client.destroy(), upstream.destroy())
    client.on("error", end).on("close", end)
    upstream.on("error", end).on("close", end)
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const url = new URL(target)
  url.port = String((server.address() as { port: number }).port)
  url.hostname = "127.0.0.1"
  return {
    url: url.toString(),
    arm: () => void (armed = true),
    close: () => (links.forEach((s) => s.destroy()), server.close())
  }
}

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

  it.live("a connection terminated in the same read as its statement's answer, while a caller waits for it, is dropped: the process lives on and the caller gets a connection that works", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const via = yield* Effect.acquireRelease(Effect.promise(() => terminating(new URL(inject("pgUrl")))), (p) => Effect.sync(p.close))
        const ctx = yield* Layer.build(PgStore.clientLayer({ url: Redacted.make(via.url), maxConnections: 1 }))
        const sql = <A extends object>(text: string) => Effect.provide(Effect.flatMap(SqlClient.SqlClient, (s) => s.unsafe<A>(text)), ctx)
        yield* sql("SELECT 1")
        // The one connection runs a statement; a second caller waits for it.
        const first = yield* Effect.fork(sql<{ x: number }>("SELECT 1 AS x FROM pg_sleep(0.4)"))
        yield* Effect.sleep("100 millis")
        const second = yield* Effect.fork(sql<{ x: number }>("SELECT 2 AS x"))
        yield* Effect.sleep("100 millis")
        // The first statement's answer arrives with the backend's termination behind it. Before,
        // the connection was handed to the waiter a microtask after its release, the termination
        // was read in between with nobody listening, and the process died of an unhandled 'error'.
        via.arm()
        expect(yield* Fiber.join(first)).toEqual([{ x: 1 }])
        expect(yield* Fiber.join(second).pipe(Effect.timeout("10 seconds"))).toEqual([{ x: 2 }])
        expect(yield* sql<{ x: number }>("SELECT 3 AS x")).toEqual([{ x: 3 }])
      })
    ), 30_000)
})
