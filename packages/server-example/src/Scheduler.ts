import { DiscoveryCycle, type SourceClient } from "@scanfleet/adapters"
import { Config, type Discovery, type Errors, type Source, Store } from "@scanfleet/core"
import { Clock, Context, Data, Duration, Effect, Layer, Random } from "effect"

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

/** The discovery scheduler of one server process. */
export class Scheduler extends Context.Tag("@scanfleet/server-example/Scheduler")<
  Scheduler,
  {
    /** The sources with a schedule. */
    readonly sources: ReadonlyArray<Source.Source>
    /** Runs one cycle of a source now, once any cycle of it in flight has ended. */
    readonly runNow: (source: Source.Source) => Effect.Effect<Discovery.Cycle, Errors.StoreError | UnknownSource>
    /** Runs one cycle of a source unless one is in flight in this process; null when skipped. */
    readonly tryRunNow: (source: Source.Source) => Effect.Effect<Discovery.Cycle | null, Errors.StoreError | UnknownSource>
  }
>() {}

/**
 * Builds the scheduler over the store. Each source has one permit: two
 * cycles of one source never overlap in this process (a manual run waits for
 * the scheduled one). Across processes the store's fenced promotion keeps
 * concurrent cycles safe. Each cycle reads the managed configuration in force.
 */
export const make = (schedules: ReadonlyArray<SourceSchedule>): Effect.Effect<Context.Tag.Service<Scheduler>, never, Store.Store> =>
  Effect.gen(function* () {
    const store = yield* Store.Store
    const bySource = new Map<Source.Source, { readonly schedule: SourceSchedule; readonly permit: Effect.Semaphore }>()
    for (const schedule of schedules) {
      if (bySource.has(schedule.client.source))
        return yield* Effect.dieMessage(`two schedules for ${schedule.client.source}: give one client several listings instead`)
      bySource.set(schedule.client.source, { schedule, permit: yield* Effect.makeSemaphore(1) })
    }
    const once = (schedule: SourceSchedule) =>
      Effect.gen(function* () {
        const active = yield* store.activeConfig()
        const now = yield* Clock.currentTimeMillis
        return yield* DiscoveryCycle.run(schedule.client, store, { limits: schedule.limits, config: active ? active.document : Config.defaults }, now)
      })
    const entry = (source: Source.Source) => {
      const e = bySource.get(source)
      return e ? Effect.succeed(e) : Effect.fail(new UnknownSource({ source }))
    }
    return {
      sources: [...bySource.keys()],
      runNow: (source) => Effect.flatMap(entry(source), (e) => e.permit.withPermits(1)(once(e.schedule))),
      tryRunNow: (source) =>
        Effect.flatMap(entry(source), (e) =>
          Effect.map(e.permit.withPermitsIfAvailable(1)(once(e.schedule)), (o) => (o._tag === "Some" ? o.value : null))
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
        Effect.catchAllCause((cause) => Effect.logError("discovery cycle failed", cause).pipe(Effect.annotateLogs({ source: schedule.client.source })))
      )
      yield* Effect.sleep(Duration.millis(schedule.intervalMs + (yield* jitter(schedule.jitterMs))))
    }
  })

/**
 * The scheduler as a layer: provides `Scheduler` and runs one loop per
 * source for the lifetime of the layer (interrupted when it is released).
 *
 * @example
 * const discovery = Scheduler.layer([{ client, intervalMs: 300_000, jitterMs: 30_000, limits: { maxPages: 10, maxResults: 1000 } }])
 */
export const layer = (schedules: ReadonlyArray<SourceSchedule>): Layer.Layer<Scheduler, never, Store.Store> =>
  Layer.scoped(
    Scheduler,
    Effect.gen(function* () {
      const scheduler = yield* make(schedules)
      for (const s of schedules) yield* Effect.forkScoped(loop(scheduler, s))
      return scheduler
    })
  )
