import { Deferred, Effect, Exit } from "effect"

/**
 * Merges concurrent calls of one operation into batches: a call made while fewer than
 * `inFlight` batches (default 1) are running starts one at once (nothing waits when the
 * store is idle); calls made while they all run wait for one to end and then go together,
 * up to `max` per batch.
 * `run` answers every item of its batch, in order, each with its own exit; a failure
 * of the whole batch answers each item with that failure.
 *
 * `split` says whether an item may join a batch already holding `batch`; an item that
 * may not waits for the next one (two results of one reservation never share a batch).
 * An interrupted caller stops waiting; its item still runs with its batch.
 */
export const make = <I, A, E>(options: {
  readonly max: number
  readonly inFlight?: number
  readonly run: (batch: ReadonlyArray<I>) => Effect.Effect<ReadonlyArray<Exit.Exit<A, E>>, E>
  readonly fits?: (item: I, batch: ReadonlyArray<I>) => boolean
}): ((item: I) => Effect.Effect<A, E>) => {
  type Waiting = { readonly item: I; readonly done: Deferred.Deferred<A, E> }
  let queue: Array<Waiting> = []
  let running = 0
  const lanes = Math.max(1, options.inFlight ?? 1)

  const take = (): Array<Waiting> => {
    const batch: Array<Waiting> = []
    const items: Array<I> = []
    const rest: Array<Waiting> = []
    for (const w of queue) {
      if (batch.length < options.max && (options.fits === undefined || options.fits(w.item, items))) {
        batch.push(w)
        items.push(w.item)
      } else rest.push(w)
    }
    queue = rest
    return batch
  }

  // One lane: a batch at a time, until the queue is empty; each answer goes to its own caller.
  const drain: Effect.Effect<void> = Effect.suspend(() => {
    const batch = take()
    if (batch.length === 0) {
      running--
      return Effect.void
    }
    return Effect.exit(options.run(batch.map((w) => w.item))).pipe(
      Effect.flatMap((exit) =>
        Effect.forEach(
          batch,
          (w, i) => Deferred.done(w.done, Exit.isSuccess(exit) ? (exit.value[i] ?? Exit.die(new Error("a batch left an item unanswered"))) : Exit.failCause(exit.cause)),
          { discard: true }
        )
      ),
      Effect.zipRight(drain)
    )
  })

  return (item) =>
    Effect.flatMap(Deferred.make<A, E>(), (done) => {
      queue.push({ item, done })
      if (running >= lanes) return Deferred.await(done)
      running++
      return Effect.zipRight(Effect.forkDaemon(drain), Deferred.await(done))
    })
}
