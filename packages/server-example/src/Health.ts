import { Migrator, PgStore } from "@scanfleet/adapters"
import { Operations } from "@scanfleet/core"
import { Clock, Context, Duration, Effect, Layer, Option, Ref } from "effect"

/** What the readiness probe knows about this process: when the expiry sweeper last finished a sweep, and last tried one. */
export class Health extends Context.Tag("@scanfleet/server-example/Health")<
  Health,
  {
    readonly lastSweepAt: Ref.Ref<number | null>
    readonly lastTryAt: Ref.Ref<number | null>
    /** The schema version the last probe read, for a probe that cannot read it (every connection in use). */
    readonly lastVersion: Ref.Ref<Option.Option<number | null>>
    readonly sweepIntervalMs: number
  }
>() {}

/** A fresh health record for a process whose sweeper runs every `sweepIntervalMs`. */
export const layer = (sweepIntervalMs: number): Layer.Layer<Health> =>
  Layer.effect(
    Health,
    Effect.gen(function* () {
      return { lastSweepAt: yield* Ref.make<number | null>(null), lastTryAt: yield* Ref.make<number | null>(null), lastVersion: yield* Ref.make(Option.none<number | null>()), sweepIntervalMs }
    })
  )

/** Records a finished sweep (the sweeper calls it). */
export const markSwept = (now: number): Effect.Effect<void, never, Health> => Effect.flatMap(Health, (h) => Ref.set(h.lastSweepAt, now))

/** Records the end of a sweep that was tried, finished or failed (the sweeper calls it). */
export const markTried: Effect.Effect<void, never, Health> = Effect.flatMap(Health, (h) => Effect.flatMap(Clock.currentTimeMillis, (now) => Ref.set(h.lastTryAt, now)))

/** One readiness check and what it found. */
export interface Check {
  readonly name: "database" | "migrations" | "sweeper"
  readonly ok: boolean
  readonly detail: string
}

/** The answer of `/readyz`. */
export interface Readiness {
  readonly ready: boolean
  readonly checks: ReadonlyArray<Check>
}

/** How long the database may take to answer the probe. */
export const probeTimeout = Duration.seconds(2)

/**
 * The sweeper counts as running while its last sweep finished within three intervals (plus
 * five seconds of slack); a process is not ready before its first sweep has finished.
 */
export const sweeperStale = (sweepIntervalMs: number) => 3 * sweepIntervalMs + 5000

// How the database answered the probe: through the pool, with the schema version it read; or,
// every pooled connection being in use, on a connection of the probe's own (the version unread).
type Reached = { readonly _tag: "answers"; readonly version: number | null } | { readonly _tag: "busy"; readonly usage: PgStore.PoolUsage }

type Failed = { readonly message: string }

// Some when every pooled connection is in use (a statement would queue behind them however well the
// database answers) and PostgreSQL answered the pool's own probe, on a connection outside the pool.
const busy = (pool: Option.Option<PgStore.PoolProbe["Type"]>): Effect.Effect<Option.Option<Reached>, Failed> =>
  Option.match(pool, {
    onNone: () => Effect.succeedNone,
    onSome: (p) => Effect.flatMap(p.usage, (usage) => (usage.saturated ? Effect.as(p.ask(probeTimeout), Option.some<Reached>({ _tag: "busy", usage })) : Effect.succeedNone))
  })

const pooled = (ops: Operations.Operations["Type"]): Effect.Effect<Reached, Failed> =>
  ops.schemaVersion().pipe(
    Effect.timeoutFail({ duration: probeTimeout, onTimeout: () => ({ message: `no answer within ${Duration.format(probeTimeout)}` }) }),
    Effect.map((version) => ({ _tag: "answers", version }))
  )

const reach = (ops: Operations.Operations["Type"], pool: Option.Option<PgStore.PoolProbe["Type"]>): Effect.Effect<Reached, Failed> =>
  Effect.gen(function* () {
    const saturated = yield* busy(pool)
    if (Option.isSome(saturated)) return saturated.value
    const answered = yield* Effect.either(pooled(ops))
    if (answered._tag === "Right") return answered.right
    // the pool may have filled while the statement waited
    return yield* Effect.flatMap(busy(pool), Option.match({ onSome: Effect.succeed, onNone: () => Effect.fail(answered.left) }))
  })

const migrationsCheck = (v: number | null): Check =>
  v === null
    ? { name: "migrations", ok: true, detail: "the store keeps no schema (memory)" }
    : { name: "migrations", ok: v === Migrator.latest, detail: v === Migrator.latest ? `at ${v}` : `at ${v}, this build needs ${Migrator.latest}` }

/**
 * The readiness checks: the database answers within `probeTimeout` (through the pool, or, when
 * every pooled connection is in use, on a connection of the probe's own: a busy database answers,
 * and the server stays in rotation), its schema is at the newest migration this build knows
 * (`Migrator.latest`; a memory store has none; while the pool is busy, as last read), and the
 * expiry sweeper finished a sweep recently (`sweeperStale`; while the pool is busy, tried one:
 * a sweep waits for a connection like every request).
 */
export const readiness: Effect.Effect<Readiness, never, Health | Operations.Operations> = Effect.gen(function* () {
  const h = yield* Health
  const ops = yield* Operations.Operations
  const reached = yield* Effect.either(reach(ops, yield* Effect.serviceOption(PgStore.PoolProbe)))
  const now = yield* Clock.currentTimeMillis
  const checks: Array<Check> = []
  if (reached._tag === "Left") {
    checks.push({ name: "database", ok: false, detail: `unreachable: ${reached.left.message}` })
    checks.push({ name: "migrations", ok: false, detail: "unknown while the database is unreachable" })
  } else if (reached.right._tag === "answers") {
    yield* Ref.set(h.lastVersion, Option.some(reached.right.version))
    checks.push({ name: "database", ok: true, detail: "answers" })
    checks.push(migrationsCheck(reached.right.version))
  } else {
    const { inUse, max, waiting } = reached.right.usage
    checks.push({ name: "database", ok: true, detail: `answers; busy: all ${inUse} of ${max} pooled connections in use, ${waiting} waiting for one` })
    const last = yield* Ref.get(h.lastVersion)
    checks.push(
      Option.match(last, {
        onNone: () => ({ name: "migrations", ok: true, detail: "not read while every pooled connection is in use (the store migrated when it started)" }),
        onSome: (v) => ({ ...migrationsCheck(v), detail: `${migrationsCheck(v).detail} (as last read: every pooled connection is in use)` })
      })
    )
  }
  checks.push(sweeperCheck(now, h.sweepIntervalMs, yield* Ref.get(h.lastSweepAt), yield* Ref.get(h.lastTryAt), reached._tag === "Right" && reached.right._tag === "busy"))
  return { ready: checks.every((c) => c.ok), checks }
})

const sweeperCheck = (now: number, intervalMs: number, last: number | null, tried: number | null, busy: boolean): Check => {
  const stale = sweeperStale(intervalMs)
  if (last !== null && now - last <= stale) return { name: "sweeper", ok: true, detail: `last sweep ${now - last} ms ago` }
  const late = last === null ? "no sweep has finished since start" : `last sweep ${now - last} ms ago (more than ${stale} ms)`
  if (busy && tried !== null && now - tried <= stale) return { name: "sweeper", ok: true, detail: `${late}; it runs, its sweeps wait for a connection like every request (last tried ${now - tried} ms ago)` }
  return { name: "sweeper", ok: false, detail: late }
}
