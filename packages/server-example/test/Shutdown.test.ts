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
      expect(warning).toMatchObject({ level: "warning", inFlight: 1, requests: ["GET /v1/admin/summary"] })
      expect(lines.map((l) => JSON.parse(l).message)).toContain("server stopped")
    } finally {
      Effect.runSync(Deferred.succeed(comesBack, undefined))
      await rt.dispose()
    }
  })
})

describe("a listener that stops (Responses.stoppable)", () => {
  const listen = (server: NodeServer) => new Promise<number>((resolve) => server.listen(0, "127.0.0.1", () => resolve((server.address() as { port: number }).port)))
  const get = (port: number) =>
    new Promise<{ status: number; headers: Record<string, unknown>; body: string }>((resolve, reject) => {
      const req = request({ host: "127.0.0.1", port, path: "/v1/assignments/claim" }, (res) => {
        let body = ""
        res.on("data", (c) => (body += c))
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }))
      })
      req.on("error", reject)
      req.end()
    })

  it("answers 503 shutting_down, with Retry-After and Connection: close, a request that reaches no handler, and leaves requests to the handler once one is attached", async () => {
    const server = Responses.stoppable(Responses.settlingEnds(createServer()), () => 1000)
    const port = await listen(server)
    try {
      // the app's handler detached, the listener not closed yet: what a stopping server goes through
      const refused = await within(5000, get(port))
      expect(refused).toMatchObject({ status: 503, headers: { "retry-after": "1", connection: "close" } })
      expect(JSON.parse((refused as { body: string }).body)).toMatchObject({ error: "shutting_down" })
      server.on("request", (_req, res) => void res.end("handled"))
      expect(await within(5000, get(port))).toMatchObject({ status: 200, body: "handled" })
    } finally {
      server.closeAllConnections()
      server.close()
    }
  })

  it("destroys the connections still open graceMs after close begins: a client trickling its body no longer holds the close for ever", async () => {
    let entered = false
    // the app's handler attached after the wrapper, as @effect/platform-node attaches it
    const server = Responses.stoppable(createServer(), () => 300)
    server.on("request", (req, res) => {
      entered = true
      req.resume()
      req.on("end", () => res.end("ok"))
    })
    const port = await listen(server)
    const req = request({ host: "127.0.0.1", port, method: "POST", path: "/", headers: { "content-length": 1000 } })
    req.on("error", () => {})
    req.write("x".repeat(10))
    for (let i = 0; i < 500 && !entered; i++) await new Promise((r) => setTimeout(r, 10))
    expect(entered).toBe(true)
    const started = Date.now()
    // Node stops enforcing its request timeout once the listener closes: without the bound, this waits for ever
    expect(await within(5000, new Promise((r) => server.close(() => r("closed"))))).toBe("closed")
    expect(Date.now() - started).toBeGreaterThanOrEqual(250)
    req.destroy()
  })
})

describe("Server.layer stopping with a request that never finishes arriving", () => {
  it("stops within shutdownGraceMs of a client that keeps its request body open, and logs the server stopped", async () => {
    const lines: Array<string> = []
    vi.spyOn(console, "log").mockImplementation((...a: Array<unknown>) => void lines.push(a.map(String).join(" ")))
    try {
      const adminToken = "test-admin-token-0123456789abcdef"
      const config = ServerConfig.make({ adminToken, host: "127.0.0.1", port: 0, sweepIntervalMs: 100, logLevel: "info", databaseUrl: "memory:", shutdownGraceMs: 300 })
      const memory = Layer.effectContext(Effect.sync(() => {
        const m = MemoryStore.make()
        return Context.make(Store.Store, m).pipe(Context.add(Operations.Operations, MemoryOperations.make(m)))
      }))
      const rt = ManagedRuntime.make(Server.layer(config).pipe(Layer.provide(memory)))
      const info = await rt.runPromise(Server.Info)
      // headers and the start of a body that never ends: the route waits for the rest
      const req = request({ host: "127.0.0.1", port: info.port, method: "POST", path: "/v1/admin/config/preview", headers: { authorization: `Bearer ${adminToken}`, "content-length": 10_000 } })
      req.on("error", () => {})
      req.write('{"assignments":')
      await new Promise((r) => setTimeout(r, 300))
      expect(await within(10_000, rt.dispose().then(() => "stopped"))).toBe("stopped")
      expect(lines.map((l) => JSON.parse(l).message)).toContain("server stopped")
      req.destroy()
    } finally {
      vi.restoreAllMocks()
    }
  })
})
