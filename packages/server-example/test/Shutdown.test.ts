import { HttpRouter, HttpServer, HttpServerRequest, HttpServerResponse } from "@effect/platform"
import { NodeHttpServer, NodeHttpServerRequest } from "@effect/platform-node"
import { MemoryOperations, MemoryStore, Operations, Store } from "@scanfleet/core"
import { Context, Deferred, Effect, Layer, ManagedRuntime } from "effect"
import { createServer, request, type Server as NodeServer } from "node:http"
import { afterEach, describe, expect, it, vi } from "vitest"
import * as Responses from "../src/internal/Responses.js"
import * as Server from "../src/Server.js"
import * as ServerConfig from "../src/ServerConfig.js"

// A stopping server must stop even when clients went away at the wrong moment:
// `demo.stop()` (and a server's SIGTERM) waited for ever on both of these.

const within = <A>(ms: number, p: Promise<A>): Promise<A | "timed out"> =>
  Promise.race([p, new Promise<"timed out">((r) => setTimeout(() => r("timed out"), ms))])

/** Sends GET `path` and destroys the connection once `gone` is asked for. */
const abandoned = (port: number, path: string, headers: Record<string, string> = {}) => {
  const req = request({ host: "127.0.0.1", port, path, headers })
  req.on("error", () => {})
  req.end()
  return { gone: () => void req.destroy() }
}

describe("a response whose client went away", () => {
  // The route answers only after its client has disconnected: the response is then
  // written to a destroyed socket, and @effect/platform-node waits for `end`'s callback.
  const run = (make: () => NodeServer) =>
    Effect.runPromise(
      Effect.gen(function* () {
        const entered = yield* Deferred.make<void>()
        const ended = yield* Deferred.make<void>()
        const late = Effect.gen(function* () {
          const res = NodeHttpServerRequest.toServerResponse(yield* HttpServerRequest.HttpServerRequest)
          yield* Deferred.succeed(entered, undefined)
          yield* Effect.async<void>((resume) => (res.destroyed ? resume(Effect.void) : void res.once("close", () => resume(Effect.void))))
          return HttpServerResponse.text("too late")
        })
        const app = HttpRouter.empty.pipe(HttpRouter.get("/late", late, { uninterruptible: true }))
        yield* HttpServer.serveEffect(app, (a) => Effect.ensuring(a, Deferred.succeed(ended, undefined)))
        const port = ((yield* HttpServer.HttpServer).address as { port: number }).port
        const c = abandoned(port, "/late")
        yield* Deferred.await(entered)
        c.gone()
        return yield* Effect.promise(() => within(2000, Effect.runPromise(Deferred.await(ended)).then(() => "ended" as const)))
      }).pipe(Effect.scoped, Effect.provide(NodeHttpServer.layer(make, { host: "127.0.0.1", port: 0 })), Effect.timeout("5 seconds"), Effect.orElseSucceed(() => "the scope did not close" as const))
    )

  it("ends its request fiber when the listener settles `end` (Responses.settlingEnds)", async () => {
    expect(await run(() => Responses.settlingEnds(createServer()))).toBe("ended")
  })

  // Why settlingEnds exists: Node calls `res.end(body, cb)`'s callback on `finish` only. When this
  // starts failing, @effect/platform-node settles the write itself and settlingEnds can go.
  it("leaves its request fiber waiting for ever on a plain Node listener", async () => {
    expect(await run(() => createServer())).toBe("timed out")
  })
})

describe("Server.layer stopping", () => {
  afterEach(() => void vi.restoreAllMocks())

  it("waits at most shutdownGraceMs for a request whose client went away while the store still works on it, and says so", async () => {
    const lines: Array<string> = []
    vi.spyOn(console, "log").mockImplementation((...a: Array<unknown>) => void lines.push(a.map(String).join(" ")))
    const entered = Effect.runSync(Deferred.make<void>())
    const comesBack = Effect.runSync(Deferred.make<void>())
    // The summary's store call does not come back, and cannot be interrupted (a transaction on its way).
    const storeLayer = Layer.effectContext(
      Effect.sync(() => {
        const memory = MemoryStore.make()
        const store: Store.StoreShape = {
          ...memory,
          cycleTotals: () => Effect.zipRight(Deferred.succeed(entered, undefined), Effect.uninterruptible(Effect.zipRight(Deferred.await(comesBack), memory.cycleTotals())))
        }
        return Context.make(Store.Store, store).pipe(Context.add(Operations.Operations, MemoryOperations.make(memory)))
      })
    )
    const adminToken = "test-admin-token-0123456789abcdef"
    const config = ServerConfig.make({ adminToken, host: "127.0.0.1", port: 0, sweepIntervalMs: 100, logLevel: "info", databaseUrl: "memory:", shutdownGraceMs: 300 })
    const rt = ManagedRuntime.make(Server.layer(config).pipe(Layer.provide(storeLayer)))
    try {
      const info = await rt.runPromise(Server.Info)
      const c = abandoned(info.port, "/v1/admin/summary", { authorization: `Bearer ${adminToken}` })
      await Effect.runPromise(Deferred.await(entered))
      c.gone()
      const started = Date.now()
      expect(await within(10_000, rt.dispose().then(() => "stopped"))).toBe("stopped")
      expect(Date.now() - started).toBeGreaterThanOrEqual(250)
      const warning = lines.map((l) => JSON.parse(l)).find((l) => l.message === "requests still in flight at shutdown; stopping without them")
      expect(warning).toMatchObject({ level: "warning", inFlight: 1, graceMs: 300 })
      expect(lines.map((l) => JSON.parse(l).message)).toContain("server stopped")
    } finally {
      Effect.runSync(Deferred.succeed(comesBack, undefined))
      await rt.dispose()
    }
  })
})
