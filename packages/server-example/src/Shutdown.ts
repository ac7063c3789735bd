import { Context, Effect, Fiber, Layer, Option, Scope } from "effect"

/**
 * The one deadline of a stopping server: `graceMs` after the stop began (the listener's close, or
 * the first part released), every part still at work (requests in flight, a sweep, a discovery
 * cycle, a webhook delivery) is left behind, so a database that no longer answers cannot hold the
 * process past it. What was left is named in the stop's last line.
 */
export class Shutdown extends Context.Tag("@scanfleet/server-example/Shutdown")<
  Shutdown,
  {
    /** Starts the clock, once: later calls keep the first instant. */
    readonly begin: () => void
    /** Milliseconds left until the deadline (all of the grace before the stop began). */
    readonly leftMs: () => number
    /** Names a part left behind at the deadline. */
    readonly abandon: (what: string) => void
  }
>() {}

/**
 * A fresh deadline of `graceMs`. Releasing the layer (after every part that stops by it) logs
 * `server stopped`, a warning naming what was left behind when anything was.
 */
export const layer = (graceMs: number): Layer.Layer<Shutdown> =>
  Layer.scoped(
    Shutdown,
    Effect.gen(function* () {
      let since: number | null = null
      const abandoned: Array<string> = []
      yield* Effect.addFinalizer(() =>
        abandoned.length === 0
          ? Effect.logInfo("server stopped")
          : Effect.logWarning("server stopped").pipe(Effect.annotateLogs({ abandoned: [...abandoned], graceMs }))
      )
      return {
        begin: () => void (since ??= Date.now()),
        leftMs: () => (since === null ? graceMs : Math.max(0, since + graceMs - Date.now())),
        abandon: (what) => void abandoned.push(what)
      }
    })
  )

/**
 * `self`, stopped by the deadline: its release (interrupting its fibers, running its finalizers)
 * is waited for until the deadline at most; past it, it is left to finish on its own and named.
 * A part blocked on a database that does not answer (a transaction's rollback on a dead
 * connection waits for the answer, uninterruptibly) no longer holds the stop.
 */
export const bounded = <A, E, R>(name: string, self: Layer.Layer<A, E, R>): Layer.Layer<A, E, R | Shutdown> =>
  Layer.scopedContext(
    Effect.gen(function* () {
      const shutdown = yield* Shutdown
      const inner = yield* Scope.make()
      yield* Effect.addFinalizer((exit) =>
        Effect.gen(function* () {
          shutdown.begin()
          const closing = yield* Effect.forkDaemon(Scope.close(inner, exit))
          // A finalizer runs uninterruptibly, and a timeout can only end what it can interrupt.
          const closed = yield* Fiber.await(closing).pipe(Effect.interruptible, Effect.timeoutOption(shutdown.leftMs()))
          if (Option.isSome(closed)) return
          shutdown.abandon(name)
          yield* Effect.logWarning("did not stop by the shutdown deadline; left behind").pipe(Effect.annotateLogs({ part: name }))
        })
      )
      return yield* Layer.buildWithScope(self, inner)
    })
  )
