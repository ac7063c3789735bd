import { Effect, STM, TSemaphore } from "effect"

/**
 * Scan permits: how many scanners run at once on the device, a
 * transactional semaphore. Waiting for a permit is part of the scan stage,
 * so the target-scan deadline bounds it like everything else. `acquire` is
 * the same semaphore for the execution unit's Promise side.
 */

/** A permit pool. */
export interface Permits {
  /** The semaphore itself, for Effect code (`TSemaphore.withPermit`). */
  readonly semaphore: TSemaphore.TSemaphore
  /** Waits for a permit; resolves to its release (idempotent), or rejects when the signal aborts first. */
  readonly acquire: (signal: AbortSignal) => Promise<() => void>
  /** Permits currently handed out. */
  readonly inUse: () => number
}

/**
 * A pool of `size` permits (0 holds every scanner in `permit_wait`, which drains a device).
 *
 * @example
 * const permits = yield* Permits.makeEffect(2)
 */
export const makeEffect = (size: number): Effect.Effect<Permits> =>
  Effect.map(STM.commit(TSemaphore.make(size)), (semaphore) => ({
    semaphore,
    acquire: (signal) =>
      Effect.runPromise(
        // A take interrupted by the signal holds nothing; once taken, the release is made before anything can interrupt.
        Effect.uninterruptibleMask((restore) =>
          Effect.zipRight(
            restore(STM.commit(TSemaphore.acquire(semaphore))),
            Effect.map(Effect.once(STM.commit(TSemaphore.release(semaphore))), (release) => () => Effect.runSync(release))
          )
        ),
        { signal }
      ),
    inUse: () => size - Effect.runSync(STM.commit(TSemaphore.available(semaphore)))
  }))

/**
 * The same pool, made outside Effect.
 *
 * @example
 * const permits = Permits.make(2)
 */
export const make = (size: number): Permits => Effect.runSync(makeEffect(size))
