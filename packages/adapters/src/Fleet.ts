import { type Assignment, Config, Errors, type PhaseModel, type Source, Store, type Target } from "@scanfleet/core"
import { Cause, Effect, Exit, ManagedRuntime, Option } from "effect"
import * as Database from "./Database.js"

/**
 * The queue for programs that do not use Effect: the same Store port,
 * behind Promises. A refused call rejects with the port's own tagged error,
 * an `Error` subclass whose `reason` says why (`ClaimRejected` with
 * `reason: "capacity"`, `ReservationRefused` with `reason: "stale_fence"`, …),
 * so `instanceof` and `switch (e.reason)` both work.
 */

/** Every Store method as a Promise, with the port's parameters unchanged. */
export type PromiseStore = {
  readonly [K in keyof Store.StoreShape]: Store.StoreShape[K] extends (...args: infer A) => Effect.Effect<infer R, infer _E, infer _C> ? (...args: A) => Promise<R> : never
}

/** A worker write's credentials; `now` defaults to the current time. */
export interface Authority {
  readonly deviceId: number
  readonly reservationId: number
  readonly fence: number
  readonly now?: number
}

/** An open queue. Call `close` when done: it closes the database connections. */
export interface Fleet {
  /** Records what discovery saw: new identities become pending, known ones only raise their newest remote timestamp. */
  readonly recordObservations: (batch: ReadonlyArray<Target.Observation>, now?: number) => Promise<Store.RecordResult>
  /** Queues up to `rule.budget` targets of a source that changed since their last scan and are out of cooldown. */
  readonly promote: (source: Source.Source, rule: Store.PromoteRule, now?: number) => Promise<Store.PromoteResult>
  /**
   * Claims one pending target for a device slot, or resolves `null` when none is pending. The
   * managed configuration in force (or the defaults) sets its deadlines unless `config` is given.
   * It is read at most once a second (`Store.configInForce`): a version applied through this
   * fleet's `store.applyConfig` counts from the next claim, one applied by another process within
   * a second.
   */
  readonly claim: (req: {
    readonly deviceId: number
    readonly slot: number
    readonly now?: number
    readonly config?: Config.ManagedConfig
    readonly sources?: ReadonlyArray<Source.Source>
    readonly sourceCap?: number
  }) => Promise<Assignment.Assignment | null>
  /** Appends phase events of a claimed assignment (idempotent by sequence number). */
  readonly progress: (auth: Authority, events: ReadonlyArray<PhaseModel.Event>) => Promise<{ readonly results: ReadonlyArray<Store.Acceptance>; readonly assignment: Assignment.Assignment }>
  /** Submits the result of a claimed assignment; a resubmission resolves the original receipt. */
  readonly submitResult: (
    input: Authority & { readonly outcome: Assignment.Outcome; readonly finalPhase: PhaseModel.Phase | null; readonly body: string }
  ) => Promise<Assignment.Receipt>
  /**
   * Submits a result, then claims `next.slot` of the same device at the same time: a scanner's
   * loop in one call (one round trip on PostgreSQL). A refused result rejects and claims nothing;
   * a refused claim resolves with `claimRefused` set and the result kept. The configuration is
   * `claim`'s unless `next.config` is given.
   */
  readonly submitResultAndClaim: (
    input: Authority & { readonly outcome: Assignment.Outcome; readonly finalPhase: PhaseModel.Phase | null; readonly body: string },
    next: { readonly slot: number; readonly config?: Config.ManagedConfig; readonly sources?: ReadonlyArray<Source.Source>; readonly sourceCap?: number }
  ) => Promise<Store.ResultAndClaim>
  /** Every other operation of the Store port (devices, expiry, percentiles, counts), as Promises. */
  readonly store: PromiseStore
  /** Closes the database; later calls reject with `StoreError` (`reason: "unavailable"`). */
  readonly close: () => Promise<void>
}

/** Where the queue lives. */
export interface Options {
  /** `sqlite:<path>` or a path, `postgres://…` / `postgresql://…`, or `memory:`. */
  readonly database: string
  /** PostgreSQL connection pool size (default 10). */
  readonly poolSize?: number
  /** PostgreSQL prepared hot statements (default true). */
  readonly prepare?: boolean
}

/** The port's errors, for `instanceof`. */
export const { ClaimRejected, NotFound, ProgressRejected, ReservationRefused, StoreError } = Errors
/** A database URL naming no backend; `openFleet` rejects with it. */
export const DatabaseUrlError = Database.DatabaseUrlError

// The failure itself, not a wrapper: callers match on the port's tagged errors.
const unwrap = <A, E>(exit: Exit.Exit<A, E>): A => {
  if (Exit.isSuccess(exit)) return exit.value
  const failure = Cause.failureOption(exit.cause)
  throw Option.isSome(failure) ? failure.value : Cause.squash(exit.cause)
}

/**
 * Opens the queue a database URL names, migrated to the latest schema.
 *
 * @example
 * import { openFleet } from "@scanfleet/adapters"
 *
 * const fleet = await openFleet({ database: "sqlite:./queue.db" })
 * await fleet.recordObservations([{ source: "github", identity: "octo/repo", remoteAt: Date.parse("2025-01-01T00:00:00Z") }])
 * await fleet.close()
 */
export const openFleet = async (options: Options): Promise<Fleet> => {
  const refused = Database.check(options.database)
  if (refused) throw refused
  const runtime = ManagedRuntime.make(
    Database.layer(options.database, { ...(options.poolSize !== undefined ? { poolSize: options.poolSize } : {}), ...(options.prepare !== undefined ? { prepare: options.prepare } : {}) })
  )
  const store = unwrap(await runtime.runPromiseExit(Store.Store))
  let closed = false
  const run = async <A, E>(effect: Effect.Effect<A, E>): Promise<A> => {
    if (closed) throw new Errors.StoreError({ reason: "unavailable", message: "the fleet is closed" })
    return unwrap(await runtime.runPromiseExit(effect))
  }
  const promised = Object.fromEntries(
    Object.entries(store).map(([name, f]) => [name, (...args: Array<unknown>) => run((f as (...a: Array<unknown>) => Effect.Effect<unknown, unknown>)(...args))])
  ) as unknown as PromiseStore
  const at = (now: number | undefined) => now ?? Date.now()
  const inForce = unwrap(await runtime.runPromiseExit(Store.configInForce(store)))
  const configured = async (config: Config.ManagedConfig | undefined) => config ?? (await run(inForce.current)).document
  return {
    store: {
      ...promised,
      // Claims that follow see the version applied here, whether or not its answer arrived.
      applyConfig: async (...args) => {
        try {
          return await promised.applyConfig(...args)
        } finally {
          if (!closed) await runtime.runPromise(inForce.invalidate)
        }
      }
    },
    recordObservations: (batch, now) => promised.recordObservations(batch, at(now)),
    promote: (source, rule, now) => promised.promote(source, rule, at(now)),
    claim: async ({ config, now, ...req }) => promised.claim({ ...req, now: at(now), config: await configured(config) }),
    progress: ({ now, ...auth }, events) => promised.appendProgress({ ...auth, now: at(now) }, events),
    submitResult: ({ now, ...input }) => promised.submitResult({ ...input, now: at(now) }),
    submitResultAndClaim: async ({ now, ...input }, { config, ...next }) =>
      promised.submitResultAndClaim({ ...input, now: at(now) }, { ...next, config: await configured(config) }),
    close: async () => {
      if (closed) return
      closed = true
      await runtime.dispose()
    }
  }
}
