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
