import { type Errors, type Findings, FindingStore, Operations } from "@scanfleet/core"
import { Clock, Context, Duration, Effect, Layer, Option, Queue, Ref, Schedule } from "effect"
import { createHmac, timingSafeEqual } from "node:crypto"
import * as Holder from "./internal/Holder.js"
import type { ServerConfig } from "./ServerConfig.js"

/**
 * Webhook delivery of the findings outbox. One subscriber reads the outbox in
 * commit order from its stored position, POSTs each event signed with
 * HMAC-SHA256, retries with exponential backoff and jitter, and moves its
 * position only after the event was delivered or dead-lettered, so a crash or
 * a receiver that is away loses nothing: at least once, in order per target
 * (the whole outbox is delivered in order). An event that exhausts its tries
 * goes to the dead-letter list, from which an operator can redeliver it.
 * Several server instances on one database deliver through one of them: the
 * one holding the `webhook` lease (`Operations.acquireLease`), renewed every
 * third of `leaseMs`; another takes over within `leaseMs` of its last renewal.
 */

/** The header carrying the signature: `t=<unix ms>,v1=<hex HMAC-SHA256 of "<t>.<body>">`. */
export const signatureHeader = "scanfleet-signature"
/** The header carrying the event's outbox position (deduplicate on it: delivery is at least once). */
export const eventHeader = "scanfleet-event"
/** The subscriber name the webhook keeps its position and dead letters under. */
export const subscriber = "webhook"

/** The lease that makes one instance the deliverer, and how long it lasts unrenewed. */
export const leaseName = "webhook"
export const leaseMs = 15_000

/** Signs a body at a time. */
export const sign = (secret: string, body: string, at: number): string => `t=${at},v1=${createHmac("sha256", secret).update(`${at}.${body}`).digest("hex")}`

/**
 * Verifies a signature header against the raw body: the HMAC matches (compared
 * in constant time) and the timestamp is within `toleranceMs` of `now`, so a
 * captured request cannot be replayed later.
 */
export const verify = (secret: string, body: string, header: string | undefined | null, now: number, toleranceMs = 5 * 60_000): boolean => {
  const parts = Object.fromEntries((header ?? "").split(",").map((p) => p.split("=", 2) as [string, string]))
  const at = Number(parts.t)
  if (!Number.isSafeInteger(at) || Math.abs(now - at) > toleranceMs || typeof parts.v1 !== "string") return false
  const want = Buffer.from(createHmac("sha256", secret).update(`${at}.${body}`).digest("hex"))
  const got = Buffer.from(parts.v1)
  return got.length === want.length && timingSafeEqual(got, want)
}

/** The webhook's controls, for the admin API. */
export class Webhook extends Context.Tag("@scanfleet/server-example/Webhooks/Webhook")<
  Webhook,
  {
    /** The events that exhausted their tries, oldest first. */
    readonly deadLetters: Effect.Effect<ReadonlyArray<FindingStore.DeadLetter>, Errors.StoreError>
    /**
     * Delivers a dead letter again with a fresh budget; false when there is no such letter.
     * The letter stays listed until the event is delivered (a restart meanwhile loses nothing),
     * and is updated with the new attempts and error if the budget runs out again.
     */
    readonly redeliver: (seq: number) => Effect.Effect<boolean, Errors.StoreError>
  }
>() {}

/** Webhook settings, from the server's configuration. */
export type Settings = Pick<ServerConfig, "webhookUrl" | "webhookSecret" | "webhookMaxTries" | "webhookTimeoutMs" | "webhookBaseDelayMs" | "webhookMaxDelayMs" | "webhookPollMs">

class DeliveryFailed extends Error {}

/**
 * Why a webhook URL cannot be used, or undefined when it can: it must be an absolute
 * `http:` or `https:` URL without credentials in it (a password there would travel in
 * every error and dead letter; put it in the receiver's URL path or a secret instead).
 * The message never repeats the URL.
 */
export const urlProblem = (text: string): string | undefined => {
  let u: URL
  try {
    u = new URL(text)
  } catch {
    return "is not an absolute URL"
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") return `must be an http: or https: URL, not ${u.protocol}`
  if (u.username !== "" || u.password !== "") return "must not carry a user name or password (user:password@host)"
  return undefined
}

/**
 * The delivery loop as a scoped layer (nothing when no `webhookUrl` is set or
 * the store keeps no findings). Releasing it interrupts the loop between
 * attempts; the position it stored says where the next start resumes.
 */
export const layer = (settings: Settings): Layer.Layer<never> =>
  Layer.scopedContext(
    Effect.gen(function* () {
      const found = yield* Effect.serviceOption(FindingStore.FindingStore)
      // The controls are in the context only when a webhook runs; the admin routes look for them (serviceOption).
      if (settings.webhookUrl === undefined || settings.webhookSecret === undefined || Option.isNone(found)) return Context.empty() as Context.Context<never>
      const f = found.value
      const url = settings.webhookUrl
      const secret = settings.webhookSecret
      const redeliveries = yield* Queue.unbounded<Findings.OutboxEvent>()

      const post = (e: Findings.OutboxEvent, attempt: number) =>
        Effect.tryPromise({
          try: async (signal) => {
            const body = JSON.stringify(e)
            const res = await fetch(url, {
              method: "POST",
              headers: { "content-type": "application/json", [signatureHeader]: sign(secret, body, Date.now()), [eventHeader]: String(e.seq), "scanfleet-attempt": String(attempt) },
              body,
              // A redirect is the receiver's answer, not a second address to send the event to.
              redirect: "manual",
              signal: AbortSignal.any([signal, AbortSignal.timeout(settings.webhookTimeoutMs)])
            })
            // The status is the answer: the body is never read, however large it is.
            await res.body?.cancel().catch(() => undefined)
            if (res.status >= 300 && res.status <= 399) throw new DeliveryFailed(`HTTP ${res.status}: a redirect, which is not followed`)
            if (res.status < 200 || res.status > 299) throw new DeliveryFailed(`HTTP ${res.status}`)
          },
          catch: (cause) => (cause instanceof DeliveryFailed ? cause.message : cause instanceof Error && cause.name === "TimeoutError" ? `timed out after ${settings.webhookTimeoutMs} ms` : `unreachable: ${String((cause as Error)?.cause ?? cause)}`)
        })

      // Exponential from the base delay, jittered, capped, and bounded in tries.
      const schedule = Schedule.exponential(Duration.millis(settings.webhookBaseDelayMs)).pipe(
        Schedule.jittered,
        Schedule.modifyDelay((_, d) => Duration.min(d, Duration.millis(settings.webhookMaxDelayMs))),
        Schedule.intersect(Schedule.recurs(settings.webhookMaxTries - 1))
      )

      // One event: delivered (true), or dead-lettered with its last error after the tries ran out.
      const deliver = (e: Findings.OutboxEvent) =>
        Effect.gen(function* () {
          const attempts = yield* Ref.make(0)
          const r = yield* Effect.either(Effect.retry(Effect.flatMap(Ref.updateAndGet(attempts, (n) => n + 1), (n) => post(e, n)), schedule))
          if (r._tag === "Right") return true
          const n = yield* Ref.get(attempts)
          yield* f.deadLetter(subscriber, { seq: e.seq, attempts: n, lastError: r.left, at: Date.now() })
          yield* Effect.logWarning("webhook event dead-lettered").pipe(Effect.annotateLogs({ seq: e.seq, attempts: n, error: r.left }))
          return false
        })

      // With an operator port (a server's store), only the lease holder delivers; without one, this process alone does.
      const ops = yield* Effect.serviceOption(Operations.Operations)
      const held = yield* Ref.make<Operations.Lease | null>(null)
      if (Option.isSome(ops)) {
        const o = ops.value
        const holder = Holder.make()
        const renew = Effect.flatMap(Clock.currentTimeMillis, (now) => o.acquireLease(leaseName, holder, leaseMs, now)).pipe(
          Effect.flatMap((l) => Ref.set(held, l)),
          Effect.catchAll((e) => Effect.zipRight(Ref.set(held, null), Effect.logWarning("webhook lease not renewed", e)))
        )
        yield* renew
        yield* Effect.forkScoped(Effect.forever(Effect.zipRight(Effect.sleep(Duration.millis(leaseMs / 3)), renew)))
        yield* Effect.addFinalizer(() => Effect.flatMap(Ref.get(held), (l) => (l === null ? Effect.void : Effect.ignore(o.releaseLease(l.name, l.holder, l.token)))))
      }
      const leading = Option.isNone(ops) ? Effect.succeed(true) : Effect.map(Ref.get(held), (l) => l !== null)

      const loop = Effect.gen(function* () {
        if (!(yield* leading)) return yield* Effect.sleep(Duration.millis(Math.max(settings.webhookPollMs, 200)))
        const pos = yield* f.cursor(subscriber)
        const evs = yield* f.outbox(pos, 50)
        if (evs.length === 0) return yield* Effect.sleep(Duration.millis(settings.webhookPollMs))
        for (const e of evs) {
          // a lease lost (or taken over) mid-batch: the new holder resumes at the stored position
          if (!(yield* leading)) return
          yield* deliver(e)
          yield* f.advance(subscriber, e.seq)
        }
      }).pipe(
        // a store that cannot be read is waited for; the position it holds is where delivery resumes
        Effect.catchAll((e) => Effect.zipRight(Effect.logWarning("webhook delivery paused", e), Effect.sleep(Duration.seconds(1)))),
        Effect.forever
      )
      yield* Effect.forkScoped(loop)
      // A redelivered letter leaves the list only once its event was delivered.
      const inFlight = new Set<number>()
      const redeliverOne = (e: Findings.OutboxEvent) =>
        Effect.flatMap(deliver(e), (delivered) => (delivered ? Effect.asVoid(f.takeDeadLetter(subscriber, e.seq)) : Effect.void)).pipe(
          Effect.catchAll((err) => Effect.logWarning("redelivery failed", err)),
          Effect.ensuring(Effect.sync(() => inFlight.delete(e.seq)))
        )
      yield* Effect.forkScoped(Effect.forever(Effect.flatMap(Queue.take(redeliveries), redeliverOne)))
      return Context.make(Webhook, {
        deadLetters: f.deadLetters(subscriber),
        redeliver: (seq) =>
          Effect.gen(function* () {
            if (!Number.isSafeInteger(seq) || !(yield* f.deadLetters(subscriber)).some((l) => l.seq === seq)) return false
            const [e] = yield* f.outbox(seq - 1, 1)
            if (e === undefined || e.seq !== seq) return false
            // Asked again while in flight: that delivery answers for both.
            if (inFlight.has(seq)) return true
            inFlight.add(seq)
            yield* Queue.offer(redeliveries, e)
            return true
          })
      }) as Context.Context<never>
    })
  )
