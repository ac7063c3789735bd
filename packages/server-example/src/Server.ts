import { HttpMiddleware, HttpRouter, HttpServer, HttpServerRequest, HttpServerResponse } from "@effect/platform"
import type { ServeError } from "@effect/platform/HttpServerError"
import { NodeHttpServer } from "@effect/platform-node"
import { LogLine, Operations, type Store, WorkerApi } from "@scanfleet/core"
import { Cause, Context, Deferred, Duration, Effect, FiberRef, Layer, Logger, LogLevel, Option, Ref, Scheduler } from "effect"
import { createServer, type Server as HttpNodeServer, type ServerResponse } from "node:http"
import { readFileSync } from "node:fs"
import * as AdminRoutes from "./AdminRoutes.js"
import * as ApiReference from "./ApiReference.js"
import * as Auth from "./Auth.js"
import { ApiError, toResponse } from "./ApiError.js"
import * as Console from "./Console.js"
import * as Controls from "./Controls.js"
import * as Dashboard from "./Dashboard.js"
import * as FindingRoutes from "./FindingRoutes.js"
import * as Health from "./Health.js"
import * as Metrics from "./Metrics.js"
import * as OperationsRoutes from "./OperationsRoutes.js"
import { type ServerConfig, Settings } from "./ServerConfig.js"
import * as Request from "./internal/Request.js"
import * as Responses from "./internal/Responses.js"
import * as Shutdown from "./Shutdown.js"
import * as Url from "./internal/Url.js"
import * as Sweeper from "./Sweeper.js"
import * as Webhooks from "./Webhooks.js"
import * as WorkerRoutes from "./WorkerRoutes.js"

/** Where a running server listens. */
export class Info extends Context.Tag("@scanfleet/server-example/Server/Info")<
  Info,
  {
    /** Base URL, e.g. `http://127.0.0.1:8080`. */
    readonly url: string
    readonly host: string
    readonly port: number
  }
>() {}

/** GET /metrics: Prometheus text exposition. */
const metricsRoute = Effect.gen(function* () {
  const m = yield* Metrics.Metrics
  const text = yield* m.text
  return HttpServerResponse.text(text, { contentType: m.contentType })
})

/** The body of `GET /healthz`. */
const alive = { ok: true, status: "alive" } as const

/** GET /healthz: liveness. The process answers; it checks nothing else, so an orchestrator restarts only a hung process. */
const healthRoute = Effect.succeed(HttpServerResponse.unsafeJson(alive))

/**
 * Answers `GET /healthz` in the listener itself, before any request fiber is forked: liveness
 * is that the event loop turns, so a probe never queues behind the requests in flight (during
 * a burst of hundreds of claims, the fibers' fair share would make it wait for the burst to
 * finish). Everything else goes on to the router, which has the same route for a server built
 * from it some other way.
 */
const answeringLiveness = (server: HttpNodeServer): HttpNodeServer => {
  const body = JSON.stringify(alive)
  const emit = server.emit.bind(server) as (event: string | symbol, ...args: Array<any>) => boolean
  server.emit = (event: string | symbol, ...args: Array<any>): boolean => {
    if (event === "request" && args[0].method === "GET" && args[0].url === "/healthz") {
      ;(args[1] as ServerResponse).writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) }).end(body)
      return true
    }
    return emit(event, ...args)
  }
  return server
}

/** GET /readyz: readiness. 200 when the database answers, its schema is current and the sweeper runs; else 503, naming the failed check. */
const readyRoute = Effect.map(Health.readiness, (r) => HttpServerResponse.unsafeJson(r, { status: r.ready ? 200 : 503 }))

/** Every route of the server. */
export const router: HttpRouter.HttpRouter<ApiError, Store.Store | Operations.Operations | Controls.Controls | Health.Health | Settings | Metrics.Metrics> = HttpRouter.concatAll(
  WorkerRoutes.router,
  AdminRoutes.router,
  OperationsRoutes.router,
  Dashboard.router,
  Console.router,
  FindingRoutes.router
).pipe(HttpRouter.get("/metrics", metricsRoute), HttpRouter.get("/healthz", healthRoute), HttpRouter.get("/readyz", readyRoute))

// The API endpoints (under /v1) whose reference documents no query string. They take none: a
// query key there is refused as an unknown key of an empty query schema (400 `invalid_query`
// at the key) before the handler runs, as the endpoints that read a query refuse one they do
// not know, so that a request the reference says nothing of changes nothing.
const queryless = new Set(
  [...ApiReference.worker, ...ApiReference.admin, ...ApiReference.operations, ...ApiReference.other]
    .filter((e) => e.path.startsWith("/v1/") && e.query === undefined)
    .map((e) => `${e.method} ${e.path}`)
)

/** The route a request matched: its template (`/v1/assignments/:id/result`) and the path parameters it holds. */
interface Matched {
  readonly route: string
  readonly params: Readonly<Record<string, string | undefined>>
}

// Set by the router's middleware, read in the same fiber by the access log (the metrics' `route`
// label) and by the log line of a refusal.
const matched = FiberRef.unsafeMake<Matched | null>(null)

const routes = router.pipe(
  HttpRouter.use((handler) =>
    Effect.flatMap(HttpRouter.RouteContext, (ctx) =>
      Effect.zipRight(
        FiberRef.set(matched, { route: ctx.route.path, params: ctx.params }),
        queryless.has(`${ctx.route.method} ${ctx.route.path}`) ? Effect.zipRight(Request.query(WorkerApi.EmptyQuery), handler) : handler
      )
    )
  )
)

// The router reads the target with `;`, `#` and undecodable segments escaped
// (`Request.routable`), so it splits the path where the client did; path parameters are
// checked against the target as sent (`originalUrl`).
const routed = Effect.flatMap(HttpServerRequest.HttpServerRequest, (req) => {
  const url = Request.routable(req.url)
  return url === req.url ? routes : Effect.provideService(routes, HttpServerRequest.HttpServerRequest, req.modify({ url }))
})

// Refusals become their JSON body; anything unexpected is logged and answered
// with a 500 that carries no detail (the log has it).
/**
 * The response of a refusal. A refusal by the store is logged with what the store said (its
 * reason and message, never sent to the client), so an operator sees why requests got
 * `store_unavailable` or `store_invalid`, and with the request it refused as far as it is known
 * (the method, the route's template and its path parameters, the device's id or the admin caller;
 * never a token or a body), so that it can be tied to a device; every other refusal is the
 * client's, and the access log's status line is enough.
 */
export const refused = (e: ApiError): Effect.Effect<HttpServerResponse.HttpServerResponse> =>
  e.detail === undefined
    ? Effect.succeed(toResponse(e))
    : Effect.gen(function* () {
        const request = Option.getOrUndefined(yield* Effect.serviceOption(HttpServerRequest.HttpServerRequest))
        const route = yield* FiberRef.get(matched)
        const caller = yield* FiberRef.get(Auth.caller)
        yield* Effect.logWarning("the store refused a request").pipe(
          Effect.annotateLogs({ status: e.status, error: e.error, detail: e.detail, ...(request && { method: request.method }), ...route, ...caller })
        )
        return toResponse(e)
      })

const app = routed.pipe(
  Effect.catchTags({
    ApiError: refused,
    RouteNotFound: () =>
      Effect.succeed(toResponse(new ApiError({ status: 404, error: "route_not_found", message: "no such endpoint; see docs/api for the list" })))
  }),
  Effect.catchAllCause((cause) =>
    Cause.isInterruptedOnly(cause)
      ? Effect.failCause(cause)
      : Effect.logError("request failed", cause).pipe(
          Effect.as(toResponse(new ApiError({ status: 500, error: "internal", message: "the server failed to handle the request; nothing is known to have changed" })))
        )
  ),
  // Every answer is what its content type says, never sniffed (a JSON body echoes stored strings).
  Effect.map(HttpServerResponse.setHeader("x-content-type-options", "nosniff"))
)

/** The requests in flight (method and path of each), so shutdown can wait for them and name those it leaves. */
class InFlight extends Context.Tag("@scanfleet/server-example/Server/InFlight")<
  InFlight,
  { readonly requests: Set<{ readonly line: string }>; readonly idle: Ref.Ref<Deferred.Deferred<void> | null> }
>() {}

/** How many of the requests left at shutdown its warning names (the count is always whole). */
const namedLeft = 20

// Structured access log: method, path without the query (which may hold the
// dashboard token), status and duration. Headers are never logged.
const accessLog = HttpMiddleware.make((httpApp) =>
  Effect.gen(function* () {
    const req = yield* HttpServerRequest.HttpServerRequest
    const flight = yield* InFlight
    const metrics = yield* Metrics.Metrics
    const start = Date.now()
    const path = Url.parse(req.url).pathname
    const entry = { line: `${req.method} ${path}` }
    flight.requests.add(entry)
    return yield* httpApp.pipe(
      Effect.tap((res) =>
        Effect.logInfo("http").pipe(
          Effect.annotateLogs({ method: req.method, path, status: res.status, ms: Date.now() - start }),
          Effect.zipLeft(Effect.flatMap(FiberRef.get(matched), (m) => Effect.sync(() => metrics.observeRequest(req.method, m?.route ?? Metrics.unmatched, res.status, (Date.now() - start) / 1000))))
        )
      ),
      Effect.ensuring(
        Effect.gen(function* () {
          flight.requests.delete(entry)
          const d = yield* Ref.get(flight.idle)
          if (flight.requests.size === 0 && d) yield* Deferred.succeed(d, undefined)
        })
      )
    )
  })
)

// Acquired before the HTTP listener, so released after it has stopped
// accepting: waits for requests still in flight before the store below it is
// closed, until the shutdown's deadline (the listener's close waits for them
// until the same deadline, Responses.stoppable), then names those it leaves.
const drain = Layer.scoped(
  InFlight,
  Effect.gen(function* () {
    const shutdown = yield* Shutdown.Shutdown
    const requests = new Set<{ readonly line: string }>()
    const idle = yield* Ref.make<Deferred.Deferred<void> | null>(null)
    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        const d = yield* Deferred.make<void>()
        yield* Ref.set(idle, d)
        if (requests.size === 0) return
        yield* Effect.logInfo("waiting for requests in flight")
        // A finalizer runs uninterruptibly, and a timeout can only end what it can interrupt:
        // without `interruptible` the wait is not bounded at all.
        const drained = yield* Deferred.await(d).pipe(Effect.interruptible, Effect.timeoutOption(Duration.millis(shutdown.leftMs())))
        if (drained._tag === "Some") return
        const left = [...requests].map((r) => r.line)
        shutdown.abandon(`${left.length} request${left.length === 1 ? "" : "s"} in flight`)
        yield* Effect.logWarning("requests still in flight at shutdown; stopping without them").pipe(
          Effect.annotateLogs({ inFlight: left.length, requests: left.slice(0, namedLeft) })
        )
      })
    )
    return { requests, idle }
  })
)

/** How long request fibers may run in one turn of the event loop before it polls for I/O again. */
const sliceMs = 10

/**
 * A scheduler that runs ready fibers in the event loop's check phase (`setImmediate`), for
 * at most `ms` per turn, first come first served; what is left runs in the next turn, after
 * the loop has polled for I/O. Effect's default scheduler runs ready fibers in microtasks
 * for up to 2,048 rounds before it lets the loop poll, and a turn with hundreds of requests
 * in flight then lasts seconds: new connections (a `/healthz` probe, a device's claim) wait
 * in the accept queue meanwhile. Here a turn's fiber work is bounded, so the server accepts
 * and reads every ~`ms` however many requests it is serving.
 */
const turnSliced = (ms: number): Scheduler.Scheduler => {
  const ready: Array<Scheduler.Task> = []
  let next = 0
  let scheduled = false
  const turn = () => {
    const end = performance.now() + ms
    try {
      while (next < ready.length && performance.now() < end) ready[next++]()
    } finally {
      if (next < ready.length) {
        // what ran is dropped once it is most of the queue, so a long busy spell does not grow it
        if (next >= 1024 && next * 2 >= ready.length) ready.splice(0, next), (next = 0)
        setImmediate(turn)
      } else {
        ready.length = 0
        next = 0
        scheduled = false
      }
    }
  }
  return Scheduler.make((task) => {
    ready.push(task)
    if (!scheduled) {
      scheduled = true
      setImmediate(turn)
    }
  }, Scheduler.defaultShouldYield)
}

const logLevels = { debug: LogLevel.Debug, info: LogLevel.Info, warning: LogLevel.Warning, error: LogLevel.Error, none: LogLevel.None } as const

/** Logs on stdout in the one scanfleet schema (`LogLine`: JSON lines, or `pretty`) at the configured level. */
export const logger = (level: ServerConfig["logLevel"], format: ServerConfig["logFormat"] = "json"): Layer.Layer<never> =>
  Layer.merge(LogLine.toConsole("stdout", format), Logger.minimumLogLevel(logLevels[level]))

/**
 * How the listener bounds a connection: idle between requests 5 s; a request's headers must
 * arrive within 15 s and the whole request within 60 s (checked every second, so a stalled one
 * is answered 408 within a second of its limit, not up to 30 s later). Silent connections
 * therefore cannot accumulate for long; a flood from many addresses is a proxy's to stop.
 */
export const listenerOptions = {
  keepAliveTimeout: 5_000,
  headersTimeout: 15_000,
  requestTimeout: 60_000,
  connectionsCheckingInterval: 1_000,
  // a request without Host is refused by `refusingMalformed`, with the JSON error body
  requireHostHeader: false
} as const

/** File descriptors kept for the database, webhook deliveries and files when connections are counted against the limit. */
export const reservedDescriptors = 256

/**
 * The most client connections open at once: the process's open-file limit less
 * `reservedDescriptors` (read from /proc on Linux; 4,096 elsewhere). Past it a new connection is
 * closed at once, so a flood of connections cannot take the descriptors the database needs.
 */
export const maxConnections = (): number => {
  try {
    const line = readFileSync("/proc/self/limits", "utf8").split("\n").find((l) => l.startsWith("Max open files"))
    const soft = Number(line?.split(/\s{2,}/)[1])
    if (Number.isSafeInteger(soft) && soft > 0) return Math.max(64, soft - reservedDescriptors)
  } catch {
    // not Linux: a fixed bound
  }
  return 4_096
}

/**
 * The running server as a layer, over any `Store` with its operator port: the Worker API, the
 * admin and operator APIs, the dashboard, `/metrics`, `/healthz`, `/readyz`, and the expiry sweeper. Releasing the layer
 * shuts down gracefully: the listener stops accepting, requests in flight
 * finish, the sweeper stops, each by one deadline (`Shutdown`: `shutdownGraceMs` after the stop
 * began; what is left then is named in the last log lines); the store (provided by the caller) closes after.
 * The layer also provides the Store it serves (wrapped to count metrics), so
 * co-located fibers such as a discovery scheduler write through the same counters, and the
 * `Shutdown` deadline they can stop by (`Shutdown.bounded`).
 *
 * @example
 * const live = Server.layer(ServerConfig.make({ adminToken, port: 0 })).pipe(Layer.provide(MemoryStore.layer))
 */
export const layer = (
  config: ServerConfig
): Layer.Layer<Info | Metrics.Metrics | Store.Store | Operations.Operations | Settings | Shutdown.Shutdown, ServeError, Store.Store | Operations.Operations> => {
  const listener = Layer.unwrapEffect(
    Effect.map(Shutdown.Shutdown, (shutdown) =>
      NodeHttpServer.layer(
        () => {
          // `requireHostHeader: false`: a request without Host is refused by `refusingMalformed`, with the JSON error body
          const server = Responses.settlingEnds(createServer(listenerOptions))
          server.maxConnections = maxConnections()
          // one deadline for the close and the requests in flight together
          return Responses.refusingMalformed(answeringLiveness(Responses.stoppable(server, () => (shutdown.begin(), shutdown.leftMs()))))
        },
        {
          host: config.host,
          port: config.port
        }
      )
    )
  )
  const info = Layer.effect(
    Info,
    HttpServer.addressWith((address) =>
      Effect.gen(function* () {
        if (address._tag !== "TcpAddress") return { url: `unix:${address.path}`, host: address.path, port: 0 }
        const host = address.hostname.includes(":") ? `[${address.hostname}]` : address.hostname
        yield* Effect.logInfo("server listening").pipe(Effect.annotateLogs({ url: `http://${host}:${address.port}` }))
        return { url: `http://${host}:${address.port}`, host: address.hostname, port: address.port }
      })
    )
  )
  // Request fibers run on the turn-sliced scheduler below (see `turnSliced`).
  const serve = Layer.scopedDiscard(Effect.withScheduler(HttpServer.serveEffect(app, accessLog), turnSliced(sliceMs)))
  const running = Layer.mergeAll(serve, info).pipe(
    Layer.provide(listener),
    Layer.provide(drain),
    Layer.provide(Shutdown.bounded("webhook delivery", Webhooks.layer(config)))
  )
  // The operator port passes through, so co-located fibers (discovery's leases) use the same one.
  const operations = Layer.effect(Operations.Operations, Operations.Operations)
  return Layer.mergeAll(running, Shutdown.bounded("expiry sweeper", Sweeper.layer(config.sweepIntervalMs)), operations).pipe(
    Layer.provide(Layer.merge(Health.layer(config.sweepIntervalMs), Controls.layer)),
    // Co-located parts (a discovery scheduler) stop by the same deadline (`Shutdown.bounded`).
    Layer.provideMerge(Shutdown.layer(config.shutdownGraceMs)),
    Layer.provideMerge(Layer.succeed(Settings, config)),
    Layer.provideMerge(Metrics.layer),
    Layer.provide(logger(config.logLevel, config.logFormat))
  )
}
