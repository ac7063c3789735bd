import type { IncomingMessage, Server, ServerResponse } from "node:http"

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
 * called, the connections still open after `graceMs` (a client trickling its body, a
 * request whose handler does not come back) are destroyed: Node stops enforcing its
 * request timeout when the listener closes, so the wait had no other bound. `onClose`
 * is told when the close begins.
 */
export const stoppable = (server: Server, graceMs: number, onClose: () => void = () => {}): Server => {
  // the listeners installed before the app's handler, this one included
  const own = server.listenerCount("request") + 1
  server.on("request", (_req: IncomingMessage, res: ServerResponse) => {
    if (server.listenerCount("request") > own || res.headersSent) return
    res.writeHead(503, { "content-type": "application/json", "content-length": Buffer.byteLength(shuttingDown), "retry-after": "1", connection: "close" }).end(shuttingDown)
  })
  const close = server.close.bind(server)
  server.close = ((callback?: (err?: Error) => void) => {
    onClose()
    const timer = setTimeout(() => server.closeAllConnections(), graceMs)
    return close((err?: Error) => {
      clearTimeout(timer)
      callback?.(err)
    })
  }) as Server["close"]
  return server
}
