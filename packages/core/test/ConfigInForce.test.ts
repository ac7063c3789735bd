import { describe, expect, it } from "@effect/vitest"
import { Effect, TestClock } from "effect"
import { Config, Errors, MemoryStore, Store } from "@scanfleet/core"

const T0 = Date.UTC(2025, 0, 1)
const withTtl = (ttlSeconds: number): Config.ManagedConfig => ({ ...Config.defaults, assignments: { ...Config.defaults.assignments, globalTtlSeconds: ttlSeconds } })

// A memory store whose reads of the configuration in force are counted, and can be made to fail.
const counted = () => {
  const store = MemoryStore.make()
  const state = { reads: 0, failing: false }
  const activeConfig = () =>
    Effect.suspend(() => {
      state.reads++
      return state.failing ? Effect.fail(new Errors.StoreError({ reason: "unavailable", message: "down" })) : store.activeConfig()
    })
  return { store, state, reader: { activeConfig } }
}

describe("Store.configInForce", () => {
  it.effect("gives the defaults while no version is applied, then the last applied version", () =>
    Effect.gen(function* () {
      const { store, reader } = counted()
      const cache = yield* Store.configInForce(reader)
      expect(yield* cache.current).toEqual({ document: Config.defaults, version: null })
      const v = yield* store.applyConfig(withTtl(1234), "test", T0)
      yield* cache.invalidate
      expect(yield* cache.current).toEqual({ document: v.document, version: v })
    }))

  it.effect("reads once per Store.inForceTtl: the same object until then, the store's newer version after", () =>
    Effect.gen(function* () {
      const { store, state, reader } = counted()
      const cache = yield* Store.configInForce(reader)
      const first = yield* cache.current
      for (let i = 0; i < 10; i++) expect(yield* cache.current).toBe(first)
      expect(state.reads).toBe(1)
      // Applied elsewhere: not seen before the copy's time is up, seen after.
      yield* store.applyConfig(withTtl(4321), "another process", T0)
      yield* TestClock.adjust("999 millis")
      expect((yield* cache.current).document.assignments.globalTtlSeconds).toBe(Config.defaults.assignments.globalTtlSeconds)
      yield* TestClock.adjust("1 millis")
      expect((yield* cache.current).document.assignments.globalTtlSeconds).toBe(4321)
      expect(state.reads).toBe(2)
    }))

  it.effect("keeps no failed read: the next call reads again", () =>
    Effect.gen(function* () {
      const { state, reader } = counted()
      const cache = yield* Store.configInForce(reader)
      state.failing = true
      const failed = yield* Effect.flip(cache.current)
      expect(failed.reason).toBe("unavailable")
      state.failing = false
      expect((yield* cache.current).version).toBeNull()
      expect(state.reads).toBe(2)
    }))
})
