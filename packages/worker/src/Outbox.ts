import type { WorkerApi } from "@scanfleet/core"
import { Clock, Data, Duration, Effect, Queue, Schedule, type Scope, Stream, SubscriptionRef } from "effect"
import type { z } from "zod"
import type { Client } from "./Client.js"
import type * as LocalState from "./LocalState.js"

/**
 * The outbox: progress events and results leave the device from the local
 * journal, per reservation in sequence order, and a result only after every
 * event before it. Only the current server's fleet is sent to: entries of
 * another fleet wait for the device to point at it again. While the server is
 * unreachable the outbox retries on a capped exponential schedule with
 * jitter; the scan stage does not wait for it. A refused item is kept with
 * the server's reason, never silently dropped; the server answers a
 * resubmission with the original acceptance, so a retry after a lost response
 * is safe.
 */

/** What became of a result. */
export type Delivered =
  | { readonly kind: "accepted"; readonly receipt: z.infer<typeof WorkerApi.Receipt> }
  | { readonly kind: "released" }
  | { readonly kind: "refused" | "abandoned"; readonly message: string }

/** Outbox options. */
export interface Options {
  readonly state: LocalState.Service
  readonly client: Client
  /** The fleet of the server the client talks to, read before every pass; the sender waits while it is unknown. */
  readonly fleet: Effect.Effect<string>
  /** First retry delay (default 100 ms); doubles up to `maxBackoffMs` (default 5 s), each delay jittered to 50–100 %. */
  readonly minBackoffMs?: number
  readonly maxBackoffMs?: number
  /** Called once per result when it is accepted, refused, or given up at its deadline. */
  readonly onResult: (key: LocalState.Key, d: Delivered) => Effect.Effect<void, LocalState.StateError | LocalState.JournalRefused>
  /** Called on each failed attempt (for logs). */
  readonly onRetry?: (key: LocalState.Key | null, message: string) => void
  /**
   * Called when a reservation that was delivering its result has none left to send: the queued result was set
   * aside as damaged when read. The caller queues it again (the sender then passes over the reservation again).
   */
  readonly onResultLost?: (key: LocalState.Key) => Effect.Effect<void, LocalState.StateError | LocalState.JournalRefused>
  /** Called when the server refuses a write of a reservation (its events or result), with the server's words, before the item is marked refused. */
  readonly onRefused?: (key: LocalState.Key, refusal: { readonly status: number; readonly error: string; readonly message: string }) => Effect.Effect<void>
}

/** A running outbox. */
export interface Outbox {
  /** Wakes the sender (something was queued). */
  readonly notify: Effect.Effect<void>
  /** Succeeds with true once nothing of the current fleet is pending, or false after `timeoutMs`. */
  readonly drain: (timeoutMs: number) => Effect.Effect<boolean>
}

const BATCH = 500

/** The server could not be reached during a pass; the schedule decides when to try again. */
class Unreachable extends Data.TaggedError("Unreachable")<{ readonly message: string }> {}

/** The outbox's retry schedule: capped exponential backoff with jitter, so a fleet of devices does not retry in step. */
export const backoff = (minMs: number, maxMs: number): Schedule.Schedule<Duration.Duration> =>
  Schedule.exponential(Duration.millis(minMs), 2).pipe(
    Schedule.modifyDelay((_, d) => Duration.min(d, Duration.millis(maxMs))),
    Schedule.jitteredWith({ min: 0.5, max: 1 })
  )

/**
 * Starts the sender in the current scope; closing the scope stops it.
 *
 * @example
 * const outbox = yield* Outbox.make({ state, client, fleet: Effect.succeed(fleetId), onResult: () => Effect.void })
 */
export const make = (opts: Options): Effect.Effect<Outbox, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { state, client } = opts
    const wake = yield* Queue.sliding<void>(1)
    const empty = yield* SubscriptionRef.make(false)
    const retry = (key: LocalState.Key | null, message: string) => Effect.sync(() => opts.onRetry?.(key, message))
    const refused = (key: LocalState.Key, e: { readonly status: number; readonly error: string; readonly message: string }) =>
      opts.onRefused ? opts.onRefused(key, { status: e.status, error: e.error, message: e.message }) : Effect.void

    // One pass over a reservation; fails when the server could not be reached.
    const flush = (key: LocalState.Key) =>
      Effect.gen(function* () {
        const a = yield* state.assignment(key)
        if (a === null) return
        const now = yield* Clock.currentTimeMillis
        for (;;) {
          const events = yield* state.pendingEvents(key, BATCH)
          if (events.length === 0) break
          if (now >= a.deadlines.expiry) {
            yield* state.markEvents(key, events.map((e) => e.seq), "abandoned", now, "the assignment expiry passed before the event was delivered")
            continue
          }
          const sent = yield* client
            .progress(
              key.reservationId,
              a.fence,
              events.map((e) => ({ seq: e.seq, kind: e.kind, phase: e.phase, at: e.at, ...(e.detail !== undefined ? { detail: e.detail } : {}) }))
            )
            .pipe(Effect.either)
          if (sent._tag === "Left") {
            const e = sent.left
            // A sequence the server already holds with other content: its copy is the timeline's, kept as it is
            // (a stand-in for a damaged entry whose original reached the server before its answer was lost).
            // Those are settled, and the rest of the batch goes again.
            if (e._tag === "ApiRefused" && e.error === "progress_rejected:conflict") {
              const held = yield* client.get(key.reservationId).pipe(Effect.either)
              if (held._tag === "Left" && held.left._tag === "ApiUnreachable") {
                yield* retry(key, held.left.message)
                return yield* new Unreachable({ message: held.left.message })
              }
              const lastSeq = held._tag === "Right" ? held.right.lastSeq : 0
              const settled = events.filter((ev) => ev.seq <= lastSeq).map((ev) => ev.seq)
              if (settled.length > 0) {
                yield* state.markEvents(key, settled, "acked", yield* Clock.currentTimeMillis, `the server already held sequence ${settled.length === 1 ? settled[0] : `${settled[0]} to ${settled.at(-1)}`}; its own copy is kept (${e.message})`.slice(0, 1000))
                continue
              }
            }
            if (e._tag === "ApiRefused") {
              yield* refused(key, e)
              yield* state.markEvents(key, events.map((ev) => ev.seq), "refused", yield* Clock.currentTimeMillis, `${e.status} ${e.error}: ${e.message}`)
              continue
            }
            yield* retry(key, e.message)
            return yield* new Unreachable({ message: e.message })
          }
          const acked = new Set(sent.right.results.map((r) => r.seq))
          yield* state.markEvents(key, events.filter((e) => acked.has(e.seq)).map((e) => e.seq), "acked", yield* Clock.currentTimeMillis)
          if (!events.every((e) => acked.has(e.seq))) return yield* new Unreachable({ message: "the server acknowledged part of a batch" })
        }
        const r = yield* state.result(key)
        if (r === null && a.status === "delivering" && opts.onResultLost) return yield* opts.onResultLost(key)
        if (r === null || r.delivery !== "pending") return
        const journal = yield* state.journal(key)
        if (journal.some((e) => e.seq <= r.afterSeq && e.delivery === "pending")) return
        // A release is worth sending until the assignment expiry; a result only until the result-upload deadline.
        if ((yield* Clock.currentTimeMillis) > (r.kind === "release" ? a.deadlines.expiry : a.deadlines.upload)) {
          const message = r.kind === "release" ? "the assignment expiry passed before the release was delivered" : "the result-upload deadline passed before the result was delivered"
          yield* state.markResult(key, "abandoned", message)
          return yield* opts.onResult(key, { kind: "abandoned", message })
        }
        const sent =
          r.kind === "release"
            ? yield* Effect.either(Effect.as(client.release(key.reservationId, r.body), { kind: "released" } as Delivered))
            : yield* Effect.either(Effect.map(client.result(key.reservationId, r.body), (receipt): Delivered => ({ kind: "accepted", receipt })))
        if (sent._tag === "Right") {
          yield* state.markResult(key, "acked")
          return yield* opts.onResult(key, sent.right)
        }
        const e = sent.left
        if (e._tag === "ApiRefused") {
          yield* refused(key, e)
          const message = `${e.status} ${e.error}: ${e.message}`
          yield* state.markResult(key, "refused", message)
          return yield* opts.onResult(key, { kind: "refused", message })
        }
        yield* state.markResult(key, "pending", e.message)
        yield* retry(key, e.message)
        return yield* new Unreachable({ message: e.message })
      })

    // Every reservation is tried even when one cannot get through; the pass fails if any could not.
    const pass = (fleetId: string) =>
      Effect.gen(function* () {
        const keys = yield* state.outboxReservations(fleetId)
        const outcomes = yield* Effect.forEach(keys, (k) => Effect.either(flush(k)))
        const failed = outcomes.find((o) => o._tag === "Left")
        if (failed !== undefined && failed._tag === "Left") return yield* failed.left
      }).pipe(
        Effect.catchTags({
          StateError: (e) => Effect.zipRight(retry(null, `outbox: ${e.message}`), new Unreachable({ message: e.message })),
          JournalRefused: (e) => Effect.zipRight(retry(null, `outbox: ${e.message}`), new Unreachable({ message: e.message }))
        })
      )

    const sender = Effect.gen(function* () {
      for (;;) {
        // Read every pass: the server behind the URL may be another fleet after a restart of it.
        const fleetId = yield* opts.fleet
        yield* Effect.retry(pass(fleetId), backoff(opts.minBackoffMs ?? 100, opts.maxBackoffMs ?? 5000))
        const left = yield* Effect.orElseSucceed(state.outboxReservations(fleetId), () => [null])
        yield* SubscriptionRef.set(empty, left.length === 0)
        // Woken by new work, or every second to pick up what another writer queued.
        yield* Effect.ignore(Effect.timeout(Queue.take(wake), Duration.seconds(1)))
      }
    })
    yield* Effect.forkScoped(sender)

    const notify = Effect.zipRight(SubscriptionRef.set(empty, false), Effect.asVoid(Queue.offer(wake, undefined)))
    return {
      notify,
      drain: (timeoutMs) =>
        Effect.zipRight(
          notify,
          empty.changes.pipe(
            Stream.filter((x) => x),
            Stream.take(1),
            Stream.runDrain,
            // Drained from a finalizer, which runs uninterruptibly: a timeout ends only what it can
            // interrupt, so without this a server that stays away held the device open for ever.
            Effect.interruptible,
            Effect.timeoutTo({ duration: Duration.millis(timeoutMs), onSuccess: () => true, onTimeout: () => false })
          )
        )
    }
  })
