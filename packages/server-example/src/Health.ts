import { Migrator } from "@scanfleet/adapters"
import { Operations } from "@scanfleet/core"
import { Clock, Context, Duration, Effect, Layer, Ref } from "effect"

/** What the readiness probe knows about this process: when the expiry sweeper last finished a sweep. */
export class Health extends Context.Tag("@scanfleet/server-example/Health")<
  Health,
  {
    readonly lastSweepAt: Ref.Ref<number | null>
    readonly sweepIntervalMs: number
  }
>() {}

/** A fresh health record for a process whose sweeper runs every `sweepIntervalMs`. */
export const layer = (sweepIntervalMs: number): Layer.Layer<Health> =>
  Layer.effect(
    Health,
    Effect.gen(function* () {
      return { lastSweepAt: yield* Ref.make<number | null>(null), sweepIntervalMs }
    })
  )

/** Records a finished sweep (the sweeper calls it). */
export const markSwept = (now: number): Effect.Effect<void, never, Health> => Effect.flatMap(Health, (h) => Ref.set(h.lastSweepAt, now))

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

/**
 * The readiness checks: the database answers within `probeTimeout`, its schema is at the
 * newest migration this build knows (`Migrator.latest`; a memory store has none), and the
 * expiry sweeper finished a sweep recently (`sweeperStale`).
 */
export const readiness: Effect.Effect<Readiness, never, Health | Operations.Operations> = Effect.gen(function* () {
  const h = yield* Health
  const ops = yield* Operations.Operations
  const now = yield* Clock.currentTimeMillis
  const version = yield* ops.schemaVersion().pipe(
    Effect.timeoutFail({ duration: probeTimeout, onTimeout: () => ({ message: `no answer within ${Duration.format(probeTimeout)}` }) }),
    Effect.either
  )
  const checks: Array<Check> = []
  if (version._tag === "Left") {
    checks.push({ name: "database", ok: false, detail: `unreachable: ${version.left.message}` })
    checks.push({ name: "migrations", ok: false, detail: "unknown while the database is unreachable" })
  } else {
    checks.push({ name: "database", ok: true, detail: "answers" })
    const v = version.right
    checks.push(
      v === null
        ? { name: "migrations", ok: true, detail: "the store keeps no schema (memory)" }
        : { name: "migrations", ok: v === Migrator.latest, detail: v === Migrator.latest ? `at ${v}` : `at ${v}, this build needs ${Migrator.latest}` }
    )
  }
  const last = yield* Ref.get(h.lastSweepAt)
  const stale = sweeperStale(h.sweepIntervalMs)
  checks.push(
    last !== null && now - last <= stale
      ? { name: "sweeper", ok: true, detail: `last sweep ${now - last} ms ago` }
      : { name: "sweeper", ok: false, detail: last === null ? "no sweep has finished since start" : `last sweep ${now - last} ms ago (more than ${stale} ms)` }
  )
  return { ready: checks.every((c) => c.ok), checks }
})
