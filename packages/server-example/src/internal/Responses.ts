import { type IncomingMessage, maxHeaderSize, type Server, type ServerResponse, STATUS_CODES } from "node:http"
import { type Duplex, finished } from "node:stream"

/**
 * Makes every response of the server answer the callback of its `end` once the
 * response is done with, finished or not.
 *
 * Node calls `res.end(body, callback)`'s callback on `finish` only: a response
 * whose client went away first (its socket destroyed) never finishes, and the
 * callback is never called. `@effect/platform-node` writes a response by waiting
 * for exactly that callback, in the uninterruptible part of the request fiber
 * (after the route, which is interruptible): a client that disconnects after the
 * route has answered but before the answer is written (a device that stops and
 * aborts its request, a client timing out under load) leaves that fiber waiting
 * for ever, and the server's count of requests in flight never comes back to
 * zero. Here the callback is also answered (with an error) when the response
 * closes first, or at once when it was already destroyed.
 */
export const settlingEnds = (server: Server): Server =>
  server.on("request", (_req: IncomingMessage, res: ServerResponse) => {
    const end = res.end
    res.end = function (this: ServerResponse, ...args: Array<unknown>) {
      const callback = args.at(-1)
      if (typeof callback !== "function") return Reflect.apply(end, this, args)
      let answered = false
      const answer = (e?: Error | null) => {
        if (answered) return
        answered = true
        this.off("close", closed)
        ;(callback as (e?: Error | null) => void)(e)
      }
      const closed = () => answer(this.writableFinished ? null : new Error("the response was closed before it finished (the client went away)"))
      if (this.destroyed) process.nextTick(closed)
      else this.once("close", closed)
      return Reflect.apply(end, this, [...args.slice(0, -1), answer])
    } as ServerResponse["end"]
  })

const shuttingDown = JSON.stringify({ error: "shutting_down", message: "the server is stopping; retry the request (on another instance, or once this one is back)" })

/**
 * Makes the listener impossible to hold open while the server stops.
 *
 * As the server stops, `@effect/platform-node` detaches its request handler first and
 * then closes the listener, which waits for every connection with a request in
 * progress. A request whose headers are read in between (a client that connected just
 * before, on a loaded machine) reached no handler and was never answered, so the close,
 * and the server's exit, waited for ever. Such a request is now answered 503
 * `shutting_down` with `Retry-After: 1` and `Connection: close`. And once `close` is
 * called, the connections still open after `graceMs()` milliseconds (asked as the close
 * begins; a client trickling its body, a request whose handler does not come back) are
 * destroyed: Node stops enforcing its request timeout when the listener closes, so the
 * wait had no other bound.
 */
export const stoppable = (server: Server, graceMs: () => number): Server => {
  // the listeners installed before the app's handler, this one included
  const own = server.listenerCount("request") + 1
  server.on("request", (_req: IncomingMessage, res: ServerResponse) => {
    if (server.listenerCount("request") > own || res.headersSent) return
    res.writeHead(503, { "content-type": "application/json", "content-length": Buffer.byteLength(shuttingDown), "retry-after": "1", connection: "close" }).end(shuttingDown)
  })
  const close = server.close.bind(server)
  server.close = ((callback?: (err?: Error) => void) => {
    const timer = setTimeout(() => server.closeAllConnections(), graceMs())
    return close((err?: Error) => {
      clearTimeout(timer)
      callback?.(err)
    })
  }) as Server["close"]
  return server
}

/** The JSON error body of a refusal made before any handler runs, and the head it is sent with. */
const refusal = (status: number, error: string, message: string) => {
  const body = JSON.stringify({ error, message })
  return { status, body, headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body), connection: "close" } }
}

/** A complete HTTP/1.1 response, for a socket that no response object owns. */
const raw = (r: ReturnType<typeof refusal>) =>
  `HTTP/1.1 ${r.status} ${STATUS_CODES[r.status]}\r\n${Object.entries(r.headers).map(([k, v]) => `${k}: ${v}\r\n`).join("")}\r\n${r.body}`

const notHttp = (what: string) => refusal(400, "bad_request", `the request is not HTTP/1.1 this server reads (${what}); nothing was done`)

/** How a request Node's parser refused is answered: the status Node itself would send, with the JSON error body. */
const parseRefusal = (e: Error & { code?: string; reason?: string }) => {
  switch (e.code) {
    case "HPE_HEADER_OVERFLOW":
      return refusal(431, "headers_too_large", `the request line and headers exceed ${maxHeaderSize} bytes; nothing was done`)
    case "HPE_CHUNK_EXTENSIONS_OVERFLOW":
      return refusal(413, "payload_too_large", "the chunk extensions of the request body exceed their limit; nothing was done")
    case "ERR_HTTP_REQUEST_TIMEOUT":
      return refusal(408, "request_timeout", "the request was not received in full within the server's request timeout; nothing was done")
    default:
      // llhttp's reasons are fixed sentences ("Invalid character in chunk size"), never request bytes
      return notHttp(e.code?.startsWith("HPE_") && e.reason ? e.reason : "it could not be parsed")
  }
}

/** The response under way on a connection, if any: the internal field Node's own `clientError` default decides on. */
const inFlight = (socket: Duplex): ServerResponse | undefined => (socket as Duplex & { _httpMessage?: ServerResponse | null })._httpMessage ?? undefined

/**
 * Makes every request Node refuses before any handler runs answered with the JSON error body,
 * as every other refusal is, rather than with an empty body or a closed socket: what its
 * parser refuses (a malformed request line, header or chunk, conflicting or invalid
 * `Content-Length` and `Transfer-Encoding`, a raw space or non-ASCII byte in the target: 400
 * `bad_request`; headers over `maxHeaderSize`: 431 `headers_too_large`; a request not received
 * within the request timeout: 408 `request_timeout`), `CONNECT` (400: the server is no proxy),
 * an HTTP/1.1 request without `Host` (400, as Node refuses it) and an `Expect` other than
 * `100-continue` (417 `expectation_failed`). Each answer carries `Connection: close`, and the
 * connection is closed after it. Nothing is ever written into a response under way: a reset
 * connection is only closed, a request whose answer has started keeps that answer, and one
 * pipelined behind another is refused after the other's answer. The server must be created
 * with `requireHostHeader: false`, so that a request without Host reaches this check rather
 * than Node's.
 */
export const refusingMalformed = (server: Server): Server => {
  // the parser reports its error again for every chunk that arrives after it: answered once
  const refused = new WeakSet<Duplex>()
  server.on("clientError", (e: Error & { code?: string }, socket: Duplex) => {
    if (refused.has(socket)) return
    refused.add(socket)
    if (e.code === "ECONNRESET" || !socket.writable) return void socket.destroy()
    const answer = () => {
      if (socket.writable) socket.write(raw(parseRefusal(e)))
      socket.destroy()
    }
    const res = inFlight(socket)
    // No response under way, or one whose every byte is already queued before ours.
    if (res === undefined || res.writableEnded) return answer()
    // The fault is in the body of the request in flight: the refusal is its answer, unless it has
    // one started already, which is then let finish (and nothing written after it).
    if (!res.req.complete) return res.headersSent ? void finished(res, () => socket.destroy()) : answer()
    // The fault is in a request pipelined after one still being answered: that answer goes first.
    finished(res, answer)
  })
  server.on("connect", (_req: IncomingMessage, socket: Duplex) => {
    if (socket.writable) socket.write(raw(notHttp("CONNECT: this server is not a proxy")))
    socket.destroy()
  })
  server.on("checkExpectation", (_req: IncomingMessage, res: ServerResponse) => {
    const r = refusal(417, "expectation_failed", "the request's Expect header is not supported (only 100-continue is); nothing was done")
    res.writeHead(r.status, r.headers).end(r.body)
  })
  // Made with `requireHostHeader: false`, Node emits an HTTP/1.1 request without Host (else it refuses it with an empty 400).
  const emit = server.emit.bind(server) as (event: string | symbol, ...args: Array<any>) => boolean
  server.emit = (event: string | symbol, ...args: Array<any>): boolean => {
    const req = args[0] as IncomingMessage
    if (event === "request" && req.httpVersion === "1.1" && req.headers.host === undefined) {
      const r = notHttp("an HTTP/1.1 request without a Host header")
      ;(args[1] as ServerResponse).writeHead(r.status, r.headers).end(r.body)
      return true
    }
    return emit(event, ...args)
  }
  return server
}
