import { Deferred, Effect, Exit } from "effect"

/**
 * Merges concurrent calls of one operation into batches: a call made while no batch
 * is in flight starts one at once (nothing waits when the store is idle); calls made
 * while one is in flight wait for it and then go together, up to `max` per batch.
 * `run` answers every item of its batch, in order, each with its own exit; a failure
 * of the whole batch answers each item with that failure.
 *
 * `split` says whether an item may join a batch already holding `batch`; an item that
 * may not waits for the next one (two results of one reservation never share a batch).
 * An interrupted caller stops waiting; its item still runs with its batch.
 */
export const make = <I, A, E>(options: {
  readonly max: number
  readonly run: (batch: ReadonlyArray<I>) => Effect.Effect<ReadonlyArray<Exit.Exit<A, E>>, E>
  readonly fits?: (item: I, batch: ReadonlyArray<I>) => boolean
}): ((item: I) => Effect.Effect<A, E>) => {
  type Waiting = { readonly item: I; readonly done: Deferred.Deferred<A, E> }
  let queue: Array<Waiting> = []
  let running = false

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

  // One batch at a time, until the queue is empty; each answer goes to its own caller.
  const drain: Effect.Effect<void> = Effect.suspend(() => {
    const batch = take()
    if (batch.length === 0) {
      running = false
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
      if (running) return Deferred.await(done)
      running = true
      return Effect.zipRight(Effect.forkDaemon(drain), Deferred.await(done))
    })
}
