import { Cause, Context, Effect, Either, Exit, Layer, Option, Scope } from "effect"
import * as fc from "effect/FastCheck"
import { expect } from "vitest"
import { Assignment, Config, PhaseModel, type Source, Store } from "@scanfleet/core"

// A model-based comparison: random command sequences run against a backend and
// against core's in-memory reference, with results and observable state
// compared after every step.

const T0 = Date.UTC(2025, 0, 1)
const MIN = 60_000
const HOUR = 60 * MIN
const DAY = 24 * HOUR

const sources = ["github", "gitlab", "dockerhub"] as const satisfies ReadonlyArray<Source.Source>
const identities = ["a", "b", "c", "d"] as const

type Cmd =
  | { readonly _tag: "discover"; readonly batch: ReadonlyArray<{ readonly source: Source.Source; readonly identity: string; readonly remoteAt: number | null }> }
  | { readonly _tag: "promote"; readonly source: Source.Source; readonly budget: number; readonly cooldownMs: number }
  | { readonly _tag: "claim"; readonly device: number; readonly slot: number; readonly sourceCap: number | undefined; readonly only: Source.Source | undefined }
  | {
      readonly _tag: "claimMany"
      readonly device: number
      readonly slots: ReadonlyArray<number>
      readonly sourceCap: number | undefined
      readonly only: Source.Source | undefined
    }
  | { readonly _tag: "progress"; readonly pick: number; readonly mode: "next" | "random" | "duplicate" | "conflict"; readonly phase: number; readonly skip: number; readonly count: number }
  | { readonly _tag: "complete"; readonly pick: number; readonly outcome: Assignment.Outcome }
  | { readonly _tag: "completeMany"; readonly picks: ReadonlyArray<number>; readonly outcome: Assignment.Outcome; readonly stale: number }
  | {
      readonly _tag: "completeAndClaim"
      readonly pick: number
      readonly outcome: Assignment.Outcome
      readonly slot: number
      readonly stale: boolean
      readonly sourceCap: number | undefined
    }
  | { readonly _tag: "release"; readonly pick: number }
  | { readonly _tag: "stale"; readonly pick: number }
  | { readonly _tag: "expire"; readonly maxAttempts: number; readonly limit: number }
  | { readonly _tag: "advance"; readonly ms: number }

const cmd: fc.Arbitrary<Cmd> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({
      _tag: fc.constant("discover" as const),
      batch: fc.array(
        fc.record({
          source: fc.constantFrom(...sources),
          identity: fc.constantFrom(...identities),
          remoteAt: fc.option(fc.integer({ min: 0, max: 48 }).map((h) => T0 - DAY + h * HOUR), { nil: null })
        }),
        { minLength: 1, maxLength: 4 }
      )
    })
  },
  { weight: 2, arbitrary: fc.record({ _tag: fc.constant("promote" as const), source: fc.constantFrom(...sources), budget: fc.integer({ min: 0, max: 3 }), cooldownMs: fc.constantFrom(0, HOUR, DAY) }) },
  {
    weight: 3,
    arbitrary: fc.record({
      _tag: fc.constant("claim" as const),
      device: fc.constantFrom(1, 1, 2, 3),
      slot: fc.integer({ min: 0, max: 2 }),
      sourceCap: fc.option(fc.integer({ min: 0, max: 2 }), { nil: undefined }),
      only: fc.option(fc.constantFrom(...sources), { nil: undefined, freq: 4 })
    })
  },
  {
    weight: 2,
    arbitrary: fc.record({
      _tag: fc.constant("claimMany" as const),
      device: fc.constantFrom(1, 1, 2, 3),
      // mostly distinct slots in range, sometimes a repeat or one past the device's two
      slots: fc.oneof(fc.shuffledSubarray([0, 1]), fc.array(fc.integer({ min: 0, max: 2 }), { maxLength: 3 })),
      sourceCap: fc.option(fc.integer({ min: 0, max: 2 }), { nil: undefined }),
      only: fc.option(fc.constantFrom(...sources), { nil: undefined, freq: 4 })
    })
  },
  {
    weight: 4,
    arbitrary: fc.record({
      _tag: fc.constant("progress" as const),
      pick: fc.nat(),
      mode: fc.constantFrom("next" as const, "next" as const, "random" as const, "duplicate" as const, "conflict" as const),
      phase: fc.integer({ min: 0, max: PhaseModel.phases.length - 1 }),
      skip: fc.integer({ min: 0, max: 2 }),
      count: fc.integer({ min: 1, max: 3 })
    })
  },
  { weight: 2, arbitrary: fc.record({ _tag: fc.constant("complete" as const), pick: fc.nat(), outcome: fc.constantFrom(...Assignment.outcomes) }) },
  {
    weight: 2,
    // a batch of results: open reservations by index (a repeat is possible), one of them sometimes with a stale fence
    arbitrary: fc.record({
      _tag: fc.constant("completeMany" as const),
      picks: fc.array(fc.nat(), { maxLength: 4 }),
      outcome: fc.constantFrom(...Assignment.outcomes),
      stale: fc.integer({ min: -1, max: 3 })
    })
  },
  {
    weight: 2,
    // a result with the claim of a slot of its device (mostly its own; sometimes another, busy or out of range)
    arbitrary: fc.record({
      _tag: fc.constant("completeAndClaim" as const),
      pick: fc.nat(),
      outcome: fc.constantFrom(...Assignment.outcomes),
      slot: fc.constantFrom(-1, -1, -1, 0, 1, 2),
      stale: fc.constantFrom(false, false, false, false, true),
      sourceCap: fc.option(fc.integer({ min: 0, max: 2 }), { nil: undefined, freq: 4 })
    })
  },
  { weight: 1, arbitrary: fc.record({ _tag: fc.constant("release" as const), pick: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ _tag: fc.constant("stale" as const), pick: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ _tag: fc.constant("expire" as const), maxAttempts: fc.integer({ min: 1, max: 3 }), limit: fc.integer({ min: 1, max: 4 }) }) },
  { weight: 2, arbitrary: fc.record({ _tag: fc.constant("advance" as const), ms: fc.constantFrom(1000, MIN, 10 * MIN, 31 * MIN, HOUR, DAY) }) }
)

// Target ids are the backend's own (a Postgres sequence skips values on upsert
// conflicts); identities name targets here, so ids are left out of comparisons.
const strip = (v: unknown): unknown => {
  if (Array.isArray(v)) return v.map(strip)
  if (v === null || typeof v !== "object") return v
  const out: Record<string, unknown> = {}
  for (const [k, x] of Object.entries(v)) if (k !== "targetId" && !(k === "id" && "identity" in v)) out[k] = strip(x)
  return out
}

const outcome = <A, E>(exit: Exit.Exit<A, E>): unknown => {
  if (Exit.isSuccess(exit)) return { ok: strip(exit.value) }
  const f = Cause.failureOption(exit.cause)
  if (Option.isNone(f)) throw Cause.squash(exit.cause)
  const e = f.value as { _tag?: string; reason?: string; seq?: number; entity?: string }
  return { error: { tag: e._tag, reason: e.reason ?? null, seq: e.seq ?? null, entity: e.entity ?? null } }
}

const snapshot = (s: Store.StoreShape) =>
  Effect.gen(function* () {
    const targets = yield* Effect.forEach(sources.flatMap((src) => identities.map((i) => [src, i] as const)), ([src, i]) => Effect.exit(s.getTarget(src, i)))
    const assignments = yield* s.listAssignments({ limit: 1000 })
    const timelines = yield* Effect.forEach(assignments, (a) => s.timeline(a.reservationId))
    return {
      targets: targets.map(outcome),
      counts: yield* s.countTargets(),
      assignments: strip(assignments),
      timelines,
      percentiles: yield* s.percentiles({ from: 0, to: Number.MAX_SAFE_INTEGER, minSamples: 1 })
    }
  })

const nextPhase = (from: PhaseModel.Phase | null, skip: number): PhaseModel.Phase => {
  if (from === null) return "assigned"
  const i = PhaseModel.phases.indexOf(from)
  return PhaseModel.phases[Math.min(PhaseModel.phases.length - 1, i + 1 + skip)]
}

/** Runs one command on a store; the model's state decides the arguments, so both stores receive the same call. */
const step = (
  s: Store.StoreShape,
  c: Cmd,
  clock: number,
  picked: Assignment.Assignment | undefined,
  prior: PhaseModel.Event | undefined,
  open: ReadonlyArray<Assignment.Assignment>
): Effect.Effect<unknown, unknown> => {
  const config = Config.defaults
  const auth = (a: Assignment.Assignment) => ({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: clock })
  switch (c._tag) {
    case "discover":
      return s.recordObservations(c.batch, clock)
    case "promote":
      return s.promote(c.source, { budget: c.budget, cooldownMs: c.cooldownMs }, clock)
    case "claim":
      return s.claim({ deviceId: c.device, slot: c.slot, now: clock, config, sourceCap: c.sourceCap, ...(c.only ? { sources: [c.only] } : {}) })
    case "claimMany":
      return s.claimMany({ deviceId: c.device, slots: c.slots, now: clock, config, sourceCap: c.sourceCap, ...(c.only ? { sources: [c.only] } : {}) })
    case "progress": {
      if (!picked) return Effect.void
      const events: Array<PhaseModel.Event> = []
      if (c.mode === "duplicate" && prior) events.push(prior)
      else if (c.mode === "conflict" && prior) events.push({ ...prior, at: prior.at + 1 })
      else if (c.mode === "random") events.push({ seq: picked.lastSeq + 1 + (c.skip === 2 ? 1 : 0), kind: c.skip === 1 ? "recovered" : "phase", phase: PhaseModel.phases[c.phase], at: clock })
      else {
        let phase = picked.lastPhase
        for (let k = 0; k < c.count; k++) {
          phase = nextPhase(phase, k === 0 ? c.skip : 0)
          events.push({ seq: picked.lastSeq + 1 + k, kind: "phase", phase, at: clock + k })
        }
      }
      return s.appendProgress(auth(picked), events)
    }
    case "complete":
      return picked ? s.submitResult({ ...auth(picked), outcome: c.outcome, finalPhase: picked.lastPhase, body: "{}" }) : Effect.void
    case "completeMany":
      // refusals compared by reason, as single commands compare their errors
      return Effect.map(s.submitResults(
        open.length === 0
          ? []
          : c.picks.map((p, i) => {
              const a = open[p % open.length]
              return { ...auth(a), fence: i === c.stale ? a.fence - 1 : a.fence, outcome: c.outcome, finalPhase: a.lastPhase, body: "{}" }
            })
      ), (rs) => rs.map((r) => (Either.isRight(r) ? { receipt: r.right } : { refused: r.left.reason })))
    case "completeAndClaim":
      // slot -1: the result's own slot
      return picked
        ? Effect.map(
            s.submitResultAndClaim(
              { ...auth(picked), fence: c.stale ? picked.fence - 1 : picked.fence, outcome: c.outcome, finalPhase: picked.lastPhase, body: "{}" },
              { slot: c.slot < 0 ? picked.slot : c.slot, config, sourceCap: c.sourceCap }
            ),
            (r) => ({ receipt: r.receipt, next: r.next, claimRefused: r.claimRefused && { reason: r.claimRefused.reason, holder: r.claimRefused.holder ?? null } })
          )
        : Effect.void
    case "release":
      return picked ? s.release(auth(picked)) : Effect.void
    case "stale":
      return picked ? s.appendProgress({ ...auth(picked), fence: picked.fence - 1 }, [{ seq: picked.lastSeq + 1, kind: "phase", phase: "failed", at: clock }]) : Effect.void
    case "expire":
      return s.expireDue({ now: clock, maxAttempts: c.maxAttempts, limit: c.limit })
    case "advance":
      return Effect.void
  }
}

const runOne = (makeStore: () => Layer.Layer<Store.Store, unknown>, makeModel: () => Store.StoreShape, cmds: ReadonlyArray<Cmd>) =>
  Effect.scoped(
    Effect.gen(function* () {
      const scope = yield* Scope.Scope
      const real = Context.get(yield* Layer.buildWithScope(makeStore(), scope), Store.Store)
      const model = makeModel()
      for (const s of [real, model]) for (const name of ["one", "two"]) yield* s.addDevice({ name, slots: 2, tokenHash: name, now: T0 })
      let clock = T0
      const log: Array<Cmd> = []
      for (const c of cmds) {
        log.push(c)
        if (c._tag === "advance") clock += c.ms
        const open = yield* model.listAssignments({ limit: 1000 })
        const picked = open.length === 0 ? undefined : open[("pick" in c ? c.pick : 0) % open.length]
        const prior = picked && picked.lastSeq > 0 ? (yield* model.timeline(picked.reservationId)).find((e) => e.seq === picked.lastSeq) : undefined
        const priorEvent = prior ? (({ acceptedAt: _, ...e }) => e)(prior) : undefined
        const expected = outcome(yield* Effect.exit(step(model, c, clock, picked, priorEvent, open)))
        const actual = outcome(yield* Effect.exit(step(real, c, clock, picked, priorEvent, open)))
        const context = `after ${log.length} commands: ${JSON.stringify(log)}`
        expect(actual, `result ${context}`).toEqual(expected)
        expect(yield* snapshot(real), `state ${context}`).toEqual(yield* snapshot(model))
      }
    })
  )

/**
 * Checks that random sequences of discover, promote, claim (one slot or a batch), progress, complete (one result, a batch, or a result
 * with its slot's next claim),
 * fail, release, expire and clock advances give the same results and the same
 * observable state on the backend as on core's model.
 */
export const check = (makeStore: () => Layer.Layer<Store.Store, unknown>, makeModel: () => Store.StoreShape, numRuns: number) =>
  Effect.promise(() =>
    fc.assert(
      fc.asyncProperty(fc.array(cmd, { minLength: 5, maxLength: 40 }), (cmds) => Effect.runPromise(runOne(makeStore, makeModel, cmds))),
      { numRuns }
    )
  )
