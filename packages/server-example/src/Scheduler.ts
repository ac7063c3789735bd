import { DiscoveryCycle, type SourceClient } from "@scanfleet/adapters"
import { Config, type Discovery, type Errors, Operations, type Source, Store } from "@scanfleet/core"
import { Clock, Context, Data, Duration, Effect, Layer, Random, Ref, Schedule } from "effect"
import * as Holder from "./internal/Holder.js"

/** How one source is discovered: its client, its cadence and its hard bounds. */
export interface SourceSchedule {
  readonly client: SourceClient.SourceClient
  /** Time between the end of one cycle and the start of the next, milliseconds. */
  readonly intervalMs: number
  /** A random extra delay in [0, jitterMs] before each cycle, so fleets of servers do not hit an API in step. */
  readonly jitterMs: number
  readonly limits: Discovery.Limits
}

/** No schedule is configured for the source asked for. */
export class UnknownSource extends Data.TaggedError("UnknownSource")<{ readonly source: Source.Source }> {}

/** The cycle did not run: an operator paused the source, or another server instance leads its discovery. */
export class Skipped extends Data.TaggedError("Skipped")<{ readonly source: Source.Source; readonly reason: "paused" | "not_leader"; readonly message: string }> {}

/** How the discovery lease of each source is held. */
export interface LeaseOptions {
  /** The lease period: a holder that stops renewing loses the lease this long after its last renewal (default 30 s). */
  readonly leaseMs: number
  /** This instance's holder name in the lease table (default host, pid and a random suffix). */
  readonly holder?: string
}

/** The default lease options. */
export const defaultLease: LeaseOptions = { leaseMs: 30_000 }

/** The lease name of a source's discovery. */
export const leaseName = (source: Source.Source) => `discovery:${source}`

/**
 * How often an instance renews a lease it holds, or tries to take one it does not: a tenth of the
 * lease period, so a leader killed without releasing its lease is replaced at most
 * `leaseMs + leaseMs / 10` after its last renewal.
 */
export const pollMs = (o: LeaseOptions) => Math.max(10, Math.floor(o.leaseMs / 10))

/** The discovery scheduler of one server process. */
export class Scheduler extends Context.Tag("@scanfleet/server-example/Scheduler")<
  Scheduler,
  {
    /** The sources with a schedule. */
    readonly sources: ReadonlyArray<Source.Source>
    /** This instance's name in the lease table. */
    readonly holder: string
    /** Runs one cycle of a source now, once any cycle of it in flight has ended; `Skipped` while it is paused or led elsewhere. */
    readonly runNow: (source: Source.Source) => Effect.Effect<Discovery.Cycle, Errors.StoreError | UnknownSource | Skipped>
    /** Runs one cycle of a source unless one is in flight in this process, it is paused or led elsewhere; null when skipped. */
    readonly tryRunNow: (source: Source.Source) => Effect.Effect<Discovery.Cycle | null, Errors.StoreError | UnknownSource>
    /** Takes or renews the lease of a source's discovery for this instance; null while another instance holds it. */
    readonly holdLease: (source: Source.Source) => Effect.Effect<Operations.Lease | null, Errors.StoreError>
    /** Gives back every lease this instance holds (on shutdown, so another instance takes over at once). */
    readonly releaseLeases: Effect.Effect<void>
  }
>() {}

/**
 * Builds the scheduler over the store. Each source has one permit: two
 * cycles of one source never overlap in this process (a manual run waits for
 * the scheduled one). Across processes a cycle runs only in the instance that
 * holds the source's discovery lease (`Operations.acquireLease`), and its
 * promotion runs under that lease (`Operations.promoteUnderLease`), so the
 * per-cycle budget is global. A paused source runs no cycle. Each cycle reads
 * the managed configuration in force.
 */
export const make = (
  schedules: ReadonlyArray<SourceSchedule>,
  lease: LeaseOptions = defaultLease
): Effect.Effect<Context.Tag.Service<Scheduler>, never, Store.Store | Operations.Operations> =>
  Effect.gen(function* () {
    const store = yield* Store.Store
    const ops = yield* Operations.Operations
    const holder = lease.holder ?? Holder.make()
    const held = yield* Ref.make(new Map<Source.Source, Operations.Lease>())
    const bySource = new Map<Source.Source, { readonly schedule: SourceSchedule; readonly permit: Effect.Semaphore }>()
    for (const schedule of schedules) {
      if (bySource.has(schedule.client.source))
        return yield* Effect.dieMessage(`two schedules for ${schedule.client.source}: give one client several listings instead`)
      bySource.set(schedule.client.source, { schedule, permit: yield* Effect.makeSemaphore(1) })
    }
    const holdLease = (source: Source.Source) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const l = yield* ops.acquireLease(leaseName(source), holder, lease.leaseMs, now)
        yield* Ref.update(held, (m) => {
          const next = new Map(m)
          if (l) next.set(source, l)
          else next.delete(source)
          return next
        })
        return l
      })
    const once = (schedule: SourceSchedule) =>
      Effect.gen(function* () {
        const source = schedule.client.source
        const control = (yield* ops.sourceControls()).find((c) => c.source === source)
        if (control?.paused)
          return yield* new Skipped({ source, reason: "paused", message: `${source} is paused by ${control.pausedBy}: ${control.reason}` })
        const l = yield* holdLease(source)
        if (l === null) return yield* new Skipped({ source, reason: "not_leader", message: `another server instance leads ${source} discovery` })
        const active = yield* store.activeConfig()
        const now = yield* Clock.currentTimeMillis
        const promote: Store.StoreShape["promote"] = (s, rule, at) =>
          Effect.flatMap(ops.promoteUnderLease(l, s, rule, at), (r) =>
            r !== null
              ? Effect.succeed(r)
              : Effect.as(Effect.logWarning("discovery lease lost before promotion; this cycle promotes nothing").pipe(Effect.annotateLogs({ source })), { promoted: [], deferred: 0 })
          )
        return yield* DiscoveryCycle.run(schedule.client, store, { limits: schedule.limits, config: active ? active.document : Config.defaults, promote }, now)
      })
    const entry = (source: Source.Source) => {
      const e = bySource.get(source)
      return e ? Effect.succeed(e) : Effect.fail(new UnknownSource({ source }))
    }
    return {
      sources: [...bySource.keys()],
      holder,
      runNow: (source) => Effect.flatMap(entry(source), (e) => e.permit.withPermits(1)(once(e.schedule))),
      tryRunNow: (source) =>
        Effect.flatMap(entry(source), (e) =>
          Effect.map(e.permit.withPermitsIfAvailable(1)(Effect.catchTag(once(e.schedule), "Skipped", () => Effect.succeed(null))), (o) =>
            o._tag === "Some" ? o.value : null
          )
        ),
      holdLease,
      releaseLeases: Effect.flatMap(Ref.getAndSet(held, new Map()), (m) =>
        Effect.forEach(m.values(), (l) => Effect.ignore(ops.releaseLease(l.name, l.holder, l.token)), { discard: true })
      )
    }
  })

const jitter = (ms: number) => (ms > 0 ? Random.nextIntBetween(0, ms + 1) : Effect.succeed(0))

/**
 * The scheduled loop of one source, forever: wait a jitter, run a cycle,
 * then wait the interval plus a fresh jitter. A failed cycle (the store was
 * unreachable) is logged and the loop goes on.
 */
export const loop = (scheduler: Context.Tag.Service<Scheduler>, schedule: SourceSchedule): Effect.Effect<never> =>
  Effect.gen(function* () {
    yield* Effect.sleep(Duration.millis(yield* jitter(schedule.jitterMs)))
    for (;;) {
      yield* scheduler.runNow(schedule.client.source).pipe(
        Effect.catchTag("Skipped", (e) => Effect.logDebug("discovery cycle skipped").pipe(Effect.annotateLogs({ source: e.source, reason: e.reason }))),
        Effect.catchAllCause((cause) => Effect.logError("discovery cycle failed", cause).pipe(Effect.annotateLogs({ source: schedule.client.source })))
      )
      yield* Effect.sleep(Duration.millis(schedule.intervalMs + (yield* jitter(schedule.jitterMs))))
    }
  })

/**
 * The lease keeper of one source, forever: every `pollMs` it renews the lease this instance holds
 * or tries to take a free or expired one, so a leader that died is replaced within one lease period
 * (plus one poll) even while the other instances wait out a long discovery interval.
 */
export const keepLease = (scheduler: Context.Tag.Service<Scheduler>, source: Source.Source, lease: LeaseOptions): Effect.Effect<never> =>
  scheduler.holdLease(source).pipe(
    Effect.catchAllCause((cause) => Effect.as(Effect.logWarning("discovery lease check failed", cause).pipe(Effect.annotateLogs({ source })), null)),
    Effect.repeat(Schedule.spaced(Duration.millis(pollMs(lease)))),
    Effect.zipRight(Effect.never)
  )

/**
 * The scheduler as a layer: provides `Scheduler` and runs one loop and one lease keeper per
 * source for the lifetime of the layer (interrupted when it is released, its leases given back).
 *
 * @example
 * const discovery = Scheduler.layer([{ client, intervalMs: 300_000, jitterMs: 30_000, limits: { maxPages: 10, maxResults: 1000 } }])
 */
export const layer = (schedules: ReadonlyArray<SourceSchedule>, lease: LeaseOptions = defaultLease): Layer.Layer<Scheduler, never, Store.Store | Operations.Operations> =>
  Layer.scoped(
    Scheduler,
    Effect.gen(function* () {
      const scheduler = yield* make(schedules, lease)
      yield* Effect.addFinalizer(() => scheduler.releaseLeases)
      for (const s of schedules) {
        yield* Effect.forkScoped(keepLease(scheduler, s.client.source, lease))
        yield* Effect.forkScoped(loop(scheduler, s))
      }
      return scheduler
    })
  )
