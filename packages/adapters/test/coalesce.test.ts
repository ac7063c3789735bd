import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber } from "effect"
import * as Coalesce from "../src/internal/Coalesce.js"

// A merger whose batches are recorded; each batch waits on `gate` when one is given.
const recorder = (options: { readonly max: number; readonly inFlight?: number; readonly gate?: Deferred.Deferred<void>; readonly fail?: (batch: ReadonlyArray<number>) => boolean }) => {
  const batches: Array<ReadonlyArray<number>> = []
  const call = Coalesce.make<number, number, string>({
    max: options.max,
    inFlight: options.inFlight,
    fits: (i, batch) => !batch.includes(i),
    run: (batch) =>
      Effect.gen(function* () {
        batches.push(batch)
        if (options.gate) yield* Deferred.await(options.gate)
        if (options.fail?.(batch)) return yield* Effect.fail("batch failed")
        return batch.map((i) => (i < 0 ? Exit.fail(`refused ${i}`) : Exit.succeed(i * 10)))
      })
  })
  return { batches, call }
}

describe("merged calls (Coalesce)", () => {
  it.effect("an idle merger runs a call at once, alone", () =>
    Effect.gen(function* () {
      const { batches, call } = recorder({ max: 8 })
      expect(yield* call(3)).toBe(30)
      expect(batches).toEqual([[3]])
    }))

  it.effect("calls made while the lanes are busy go together, at most max per batch, each answered with its own exit", () =>
    Effect.gen(function* () {
      const gate = yield* Deferred.make<void>()
      const { batches, call } = recorder({ max: 3, gate })
      const first = yield* Effect.fork(call(0))
      yield* Effect.yieldNow()
      const rest = yield* Effect.fork(Effect.all([1, 2, -3, 4, 5].map((i) => Effect.either(call(i))), { concurrency: "unbounded" }))
      yield* Effect.yieldNow()
      yield* Deferred.succeed(gate, undefined)
      expect(yield* Fiber.join(first)).toBe(0)
      const answers = yield* Fiber.join(rest)
      expect(answers.map((a) => (a._tag === "Right" ? a.right : a.left))).toEqual([10, 20, "refused -3", 40, 50])
      expect(batches).toEqual([[0], [1, 2, -3], [4, 5]])
    }))

  it.effect("an item that does not fit a batch waits for the next one", () =>
    Effect.gen(function* () {
      const gate = yield* Deferred.make<void>()
      const { batches, call } = recorder({ max: 8, gate })
      const first = yield* Effect.fork(call(9))
      yield* Effect.yieldNow()
      const rest = yield* Effect.fork(Effect.all([1, 1, 2].map((i) => call(i)), { concurrency: "unbounded" }))
      yield* Effect.yieldNow()
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(first)
      expect(yield* Fiber.join(rest)).toEqual([10, 10, 20])
      expect(batches).toEqual([[9], [1, 2], [1]])
    }))

  it.effect("a failed batch answers each of its callers with the failure, and the next batch still runs", () =>
    Effect.gen(function* () {
      const gate = yield* Deferred.make<void>()
      const { call } = recorder({ max: 2, gate, fail: (b) => b.includes(1) })
      const first = yield* Effect.fork(call(0))
      yield* Effect.yieldNow()
      const rest = yield* Effect.fork(Effect.all([1, 2, 3].map((i) => Effect.exit(call(i))), { concurrency: "unbounded" }))
      yield* Effect.yieldNow()
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(first)
      const [a, b, c] = yield* Fiber.join(rest)
      expect(a).toEqual(Exit.fail("batch failed"))
      expect(b).toEqual(Exit.fail("batch failed"))
      expect(c).toEqual(Exit.succeed(30))
    }))

  it.effect("a caller interrupted while its batch runs stops waiting; the item runs with its batch and the others are answered", () =>
    Effect.gen(function* () {
      const gate = yield* Deferred.make<void>()
      const { batches, call } = recorder({ max: 8, gate })
      const leaving = yield* Effect.fork(call(0))
      const staying = yield* Effect.fork(call(1))
      yield* Effect.yieldNow()
      yield* Effect.yieldNow()
      expect(batches).toEqual([[0, 1]])
      yield* Fiber.interrupt(leaving)
      yield* Deferred.succeed(gate, undefined)
      expect(yield* Fiber.join(staying)).toBe(10)
    }))

  it.effect("with two lanes, two calls run side by side and later ones wait for either", () =>
    Effect.gen(function* () {
      const gate = yield* Deferred.make<void>()
      const { batches, call } = recorder({ max: 8, inFlight: 2, gate })
      const all = yield* Effect.fork(
        Effect.gen(function* () {
          const a = yield* Effect.fork(call(0))
          yield* Effect.yieldNow()
          const b = yield* Effect.fork(call(1))
          yield* Effect.yieldNow()
          const c = yield* Effect.fork(Effect.all([2, 3].map((i) => call(i)), { concurrency: "unbounded" }))
          yield* Effect.yieldNow()
          return [yield* Fiber.join(a), yield* Fiber.join(b), ...(yield* Fiber.join(c))]
        })
      )
      yield* Effect.yieldNow()
      yield* Effect.yieldNow()
      yield* Effect.yieldNow()
      yield* Deferred.succeed(gate, undefined)
      expect(yield* Fiber.join(all)).toEqual([0, 10, 20, 30])
      expect(batches.slice(0, 2)).toEqual([[0], [1]])
      expect(batches.slice(2).flat().sort()).toEqual([2, 3])
    }))

  it.effect("a batch whose run throws while it builds its effect answers each of its callers with the defect, and later calls are still answered", () =>
    Effect.gen(function* () {
      const ran: Array<ReadonlyArray<number>> = []
      const call = Coalesce.make<number, number, string>({
        max: 8,
        run: (batch) => {
          ran.push(batch)
          if (batch.includes(7)) throw new Error("cannot build this statement")
          return Effect.succeed(batch.map((i) => Exit.succeed(i)))
        }
      })
      const failed = yield* Effect.exit(call(7))
      expect(Exit.isFailure(failed) && failed.cause._tag === "Die").toBe(true)
      expect(yield* call(1).pipe(Effect.timeout("2 seconds"))).toBe(1)
      expect(ran).toEqual([[7], [1]])
    }))

  it.effect("a caller interrupted while its item is still queued takes the item out: it never runs", () =>
    Effect.gen(function* () {
      const gate = yield* Deferred.make<void>()
      const { batches, call } = recorder({ max: 8, gate })
      const first = yield* Effect.fork(call(0))
      yield* Effect.yieldNow()
      const leaving = yield* Effect.fork(call(1))
      const staying = yield* Effect.fork(call(2))
      yield* Effect.yieldNow()
      yield* Fiber.interrupt(leaving)
      yield* Deferred.succeed(gate, undefined)
      expect(yield* Fiber.join(first)).toBe(0)
      expect(yield* Fiber.join(staying)).toBe(20)
      expect(batches).toEqual([[0], [2]])
    }))
})
