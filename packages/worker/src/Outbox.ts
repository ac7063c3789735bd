import type { WorkerApi } from "@scanfleet/core"
import type { z } from "zod"
import { ApiRefused, ApiUnreachable, type Client } from "./Client.js"
import type { LocalState } from "./LocalState.js"

/**
 * The outbox: progress events and results leave the device from the local
 * journal, per reservation in sequence order, and a result only after every
 * event before it. While the server is unreachable the outbox retries with
 * capped exponential backoff; the scan stage does not wait for it. A refused
 * item is kept with the server's reason, never silently dropped; the server
 * answers a resubmission with the original acceptance, so a retry after a lost
 * response is safe.
 */

/** What became of a result. */
export type Delivered =
  | { readonly kind: "accepted"; readonly receipt: z.infer<typeof WorkerApi.Receipt> }
  | { readonly kind: "released" }
  | { readonly kind: "refused" | "abandoned"; readonly message: string }

/** Outbox options. */
export interface Options {
  readonly state: LocalState
  readonly client: Client
  /** First retry delay (default 100 ms); doubles up to `maxBackoffMs` (default 5 s). */
  readonly minBackoffMs?: number
  readonly maxBackoffMs?: number
  /** Called once per result when it is accepted, refused, or given up at the result-upload deadline. */
  readonly onResult: (reservationId: number, d: Delivered) => Promise<void>
  /** Called on each failed attempt (for logs). */
  readonly onRetry?: (reservationId: number, message: string, delayMs: number) => void
}

/** A running outbox. */
export interface Outbox {
  /** Wakes the sender (something was queued). */
  readonly notify: () => void
  /** Resolves once nothing is pending, or after `timeoutMs`; true when empty. */
  readonly drain: (timeoutMs: number) => Promise<boolean>
  /** Stops the sender after its current request. */
  readonly stop: () => Promise<void>
}

const BATCH = 500

/**
 * Starts the sender loop.
 *
 * @example
 * const outbox = Outbox.start({ state, client, onResult: async () => {} })
 */
export const start = (opts: Options): Outbox => {
  const min = opts.minBackoffMs ?? 100
  const max = opts.maxBackoffMs ?? 5000
  let stopped = false
  let wake: (() => void) | null = null
  let backoff = 0
  let idle: Array<() => void> = []

  const sleep = (ms: number) =>
    new Promise<void>((r) => {
      const t = setTimeout(() => {
        wake = null
        r()
      }, ms)
      wake = () => {
        clearTimeout(t)
        wake = null
        r()
      }
    })

  // One pass over a reservation; false when the server could not be reached.
  const flush = async (id: number): Promise<boolean> => {
    const a = await opts.state.assignment(id)
    if (a === null) return true
    const now = Date.now()
    for (;;) {
      const events = await opts.state.pendingEvents(id, BATCH)
      if (events.length === 0) break
      if (now >= a.deadlines.expiry) {
        await opts.state.markEvents(id, events.map((e) => e.seq), "abandoned", now, "the assignment expiry passed before the event was delivered")
        continue
      }
      try {
        const res = await opts.client.progress(
          id,
          a.fence,
          events.map((e) => ({ seq: e.seq, kind: e.kind, phase: e.phase, at: e.at, ...(e.detail !== undefined ? { detail: e.detail } : {}) }))
        )
        const acked = new Set(res.results.map((r) => r.seq))
        await opts.state.markEvents(id, events.filter((e) => acked.has(e.seq)).map((e) => e.seq), "acked", Date.now())
        if (!events.every((e) => acked.has(e.seq))) return false
      } catch (e) {
        if (e instanceof ApiRefused) {
          await opts.state.markEvents(id, events.map((ev) => ev.seq), "refused", Date.now(), `${e.status} ${e.error}: ${e.message}`)
          continue
        }
        opts.onRetry?.(id, (e as Error).message, backoff)
        return false
      }
    }
    const r = await opts.state.result(id)
    if (r === null || r.delivery !== "pending") return true
    const journal = await opts.state.journal(id)
    if (journal.some((e) => e.seq <= r.afterSeq && e.delivery === "pending")) return true
    // A release is worth sending until the assignment expiry; a result only until the result-upload deadline.
    if (Date.now() > (r.kind === "release" ? a.deadlines.expiry : a.deadlines.upload)) {
      const message = r.kind === "release" ? "the assignment expiry passed before the release was delivered" : "the result-upload deadline passed before the result was delivered"
      await opts.state.markResult(id, "abandoned", message)
      await opts.onResult(id, { kind: "abandoned", message })
      return true
    }
    try {
      if (r.kind === "release") {
        await opts.client.release(id, r.body)
        await opts.state.markResult(id, "acked")
        await opts.onResult(id, { kind: "released" })
        return true
      }
      const receipt = await opts.client.result(id, r.body)
      await opts.state.markResult(id, "acked")
      await opts.onResult(id, { kind: "accepted", receipt })
      return true
    } catch (e) {
      if (e instanceof ApiRefused) {
        const message = `${e.status} ${e.error}: ${e.message}`
        await opts.state.markResult(id, "refused", message)
        await opts.onResult(id, { kind: "refused", message })
        return true
      }
      await opts.state.markResult(id, "pending", (e as ApiUnreachable).message)
      opts.onRetry?.(id, (e as Error).message, backoff)
      return false
    }
  }

  const loop = (async () => {
    while (!stopped) {
      let ids: ReadonlyArray<number> = []
      let reachable = true
      try {
        ids = await opts.state.outboxReservations()
        for (const id of ids) {
          if (stopped) break
          if (!(await flush(id))) reachable = false
        }
      } catch (e) {
        reachable = false
        opts.onRetry?.(0, `outbox: ${(e as Error).message}`, backoff)
      }
      if (stopped) break
      if (!reachable) {
        backoff = backoff === 0 ? min : Math.min(max, backoff * 2)
        // Jitter keeps a fleet of devices from retrying in step.
        await sleep(backoff / 2 + Math.random() * (backoff / 2))
        continue
      }
      backoff = 0
      const left = await opts.state.outboxReservations().catch(() => [1])
      if (left.length === 0) {
        const waiting = idle
        idle = []
        for (const w of waiting) w()
        await sleep(1000)
      }
    }
  })()

  return {
    notify: () => wake?.(),
    drain: (timeoutMs) =>
      new Promise<boolean>((resolve) => {
        const t = setTimeout(() => resolve(false), timeoutMs)
        idle.push(() => {
          clearTimeout(t)
          resolve(true)
        })
        wake?.()
      }),
    stop: async () => {
      stopped = true
      wake?.()
      await loop
    }
  }
}
