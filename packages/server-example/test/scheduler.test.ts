import { NodeHttpClient } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import { GitHub, GitLab } from "@scanfleet/adapters"
import * as FakeSources from "@scanfleet/adapters/testing/FakeSources"
import { MemoryOperations, MemoryStore, Operations, Store } from "@scanfleet/core"
import * as Scheduler from "../src/Scheduler.js"

const quiet = <A, E, R>(self: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const base = yield* Effect.console
    return yield* Effect.withConsole(self, { ...base, log: () => Effect.void })
  })

const fixture = (delayMs: number) =>
  Effect.gen(function* () {
    const fakes = yield* FakeSources.scoped()
    const now = Date.now()
    for (let i = 0; i < 4; i++) fakes.github.put(`acme/r${i}`, now - i * 60_000)
    fakes.gitlab.put("g/p", now)
    fakes.github.delayMs = delayMs
    fakes.gitlab.delayMs = delayMs
    const github = yield* GitHub.make({ baseUrl: fakes.github.url, pageSize: 2, listings: [{ kind: "org", org: "acme" }] }).pipe(Effect.provide(NodeHttpClient.layer))
    const gitlab = yield* GitLab.make({ baseUrl: fakes.gitlab.url }).pipe(Effect.provide(NodeHttpClient.layer))
    return { fakes, github, gitlab }
  })

const limits = { maxPages: 10, maxResults: 1000 }

// One memory store and its operator port over the same state, as one process's server would have them.
const withOps = (store: Store.StoreShape) => Context.make(Store.Store, store).pipe(Context.add(Operations.Operations, MemoryOperations.make(store)))

describe("discovery scheduler", () => {
  it.scopedLive("two cycles of one source never overlap in one process; different sources run side by side", () =>
    Effect.gen(function* () {
      const { fakes, github, gitlab } = yield* fixture(60)
      const store = MemoryStore.make()
      const scheduler = yield* Scheduler.make([
        { client: github, intervalMs: 60_000, jitterMs: 0, limits },
        { client: gitlab, intervalMs: 60_000, jitterMs: 0, limits }
      ]).pipe(Effect.provide(withOps(store)))
      const [a, b, g] = yield* quiet(Effect.all([scheduler.runNow("github"), scheduler.runNow("github"), scheduler.runNow("gitlab")], { concurrency: "unbounded" }))
      const [first, second] = a.startedAt <= b.startedAt ? [a, b] : [b, a]
      expect(second.startedAt).toBeGreaterThanOrEqual(first.endedAt)
      expect(fakes.github.maxConcurrent).toBe(1)
      expect(a.pages + b.pages).toBe(4)
      // The GitLab cycle ran while a GitHub cycle was in flight.
      expect(g.startedAt).toBeLessThan(Math.max(a.endedAt, b.endedAt))
      expect(yield* Effect.either(scheduler.runNow("dockerhub"))).toMatchObject({ _tag: "Left", left: { _tag: "UnknownSource", source: "dockerhub" } })
    })
  )

  it.scopedLive("a manual run is skipped while a cycle of that source is in flight", () =>
    Effect.gen(function* () {
      const { github } = yield* fixture(100)
      const scheduler = yield* Scheduler.make([{ client: github, intervalMs: 60_000, jitterMs: 0, limits }]).pipe(Effect.provide(withOps(MemoryStore.make())))
      const [ran, skipped] = yield* quiet(
        Effect.all([scheduler.tryRunNow("github"), Effect.sleep("20 millis").pipe(Effect.zipRight(scheduler.tryRunNow("github")))], { concurrency: 2 })
      )
      expect(ran).not.toBeNull()
      expect(skipped).toBeNull()
    })
  )

  it.scopedLive("the layer runs each source on its interval with jitter, and keeps going after a failed cycle", () =>
    Effect.gen(function* () {
      const { fakes, github } = yield* fixture(0)
      const store = MemoryStore.make()
      // Every third request fails for good: those cycles record an error and the loop carries on.
      fakes.github.requiredToken = null
      for (let i = 0; i < 3; i++) fakes.github.inject({ kind: "status", status: 400 }, { after: 2 })
      const intervalMs = 80
      const jitterMs = 40
      yield* Layer.build(Scheduler.layer([{ client: github, intervalMs, jitterMs, limits }]).pipe(Layer.provide(Layer.succeedContext(withOps(store))))).pipe(quiet)
      yield* Effect.sleep("1500 millis")
      const cycles = [...(yield* store.listCycles({ source: "github", limit: 100 }))].reverse()
      expect(cycles.length).toBeGreaterThanOrEqual(3)
      expect(cycles.some((c) => c.error !== null)).toBe(true)
      expect(cycles.at(-1)!.id).toBeGreaterThan(cycles.find((c) => c.error !== null)!.id)
      for (let i = 1; i < cycles.length; i++) {
        const gap = cycles[i].startedAt - cycles[i - 1].endedAt
        expect(gap).toBeGreaterThanOrEqual(intervalMs - 2)
      }
    })
  )

  it.scopedLive("a paused source runs no cycle; two instances on one store: only the lease holder runs cycles, and the other takes over once it lets go", () =>
    Effect.gen(function* () {
      const { github } = yield* fixture(0)
      const ctx = withOps(MemoryStore.make())
      const ops = Context.get(ctx, Operations.Operations)
      const store = Context.get(ctx, Store.Store)
      const one = yield* Scheduler.make([{ client: github, intervalMs: 60_000, jitterMs: 0, limits }], { leaseMs: 10_000, holder: "one" }).pipe(Effect.provide(ctx))
      const two = yield* Scheduler.make([{ client: github, intervalMs: 60_000, jitterMs: 0, limits }], { leaseMs: 10_000, holder: "two" }).pipe(Effect.provide(ctx))
      yield* ops.setPaused("github", true, { who: "op", why: "quota", now: Date.now() })
      expect(yield* Effect.flip(one.runNow("github"))).toMatchObject({ _tag: "Skipped", reason: "paused" })
      expect(yield* one.tryRunNow("github")).toBeNull()
      yield* ops.setPaused("github", false, { who: "op", why: "quota back", now: Date.now() })
      expect((yield* quiet(one.runNow("github"))).pages).toBeGreaterThan(0)
      expect(yield* Effect.flip(two.runNow("github"))).toMatchObject({ _tag: "Skipped", reason: "not_leader" })
      expect((yield* store.listCycles({ limit: 10 })).length).toBe(1)
      yield* one.releaseLeases
      expect((yield* quiet(two.runNow("github"))).source).toBe("github")
      expect(yield* Effect.flip(one.runNow("github"))).toMatchObject({ _tag: "Skipped", reason: "not_leader" })
    })
  )
})
