/**
 * Scan permits: a local counting semaphore that limits how many scanners run
 * at once on the device. Waiting for a permit is part of the scan stage, so
 * the target-scan deadline bounds it like everything else.
 */

/** A permit pool. */
export interface Permits {
  /** Waits for a permit; resolves to a release function, or rejects when the signal aborts first. */
  readonly acquire: (signal: AbortSignal) => Promise<() => void>
  /** Permits currently handed out. */
  readonly inUse: () => number
}

/**
 * A pool of `size` permits (0 holds every scanner in `permit_wait`, which drains a device).
 *
 * @example
 * const permits = Permits.make(2)
 */
export const make = (size: number): Permits => {
  let used = 0
  const waiters: Array<{ grant: () => void }> = []
  const release = () => {
    used--
    const next = waiters.shift()
    if (next) next.grant()
  }
  return {
    inUse: () => used,
    acquire: (signal) =>
      new Promise((resolve, reject) => {
        if (signal.aborted) return reject(signal.reason)
        let released = false
        const once = () => {
          if (!released) (released = true), release()
        }
        if (used < size) {
          used++
          return resolve(once)
        }
        const waiter = {
          grant: () => {
            signal.removeEventListener("abort", onAbort)
            used++
            resolve(once)
          }
        }
        const onAbort = () => {
          const i = waiters.indexOf(waiter)
          if (i >= 0) waiters.splice(i, 1)
          reject(signal.reason)
        }
        signal.addEventListener("abort", onAbort, { once: true })
        waiters.push(waiter)
      })
  }
}
