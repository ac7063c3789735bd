import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, type Layer } from "effect"
import * as fc from "effect/FastCheck"
import {
  Assignment,
  Config,
  Deadline,
  Discovery,
  type Errors,
  MemoryStore,
  Percentile,
  PhaseModel,
  type Source,
  Store,
  type Target,
  WorkerWrite
} from "@scanfleet/core"
import * as Model from "./internal/ModelTest.js"

export { operationsConformance, type MakeOperations, type OperationsCapabilities } from "./OperationsConformance.js"

/** What a backend can be asked to prove beyond the common behaviour. */
export interface Capabilities {
  /** Several connections really run at once (Postgres): the racing tests run. */
  readonly concurrency: boolean
  /** Random command sequences compared with core's model (default 12 runs; 0 skips, loudly). */
  readonly modelRuns?: number
}

/** Builds a fresh, empty Store for one test; its resources are released after the test. */
export type MakeStore = () => Layer.Layer<Store.Store, unknown>

type S = Store.StoreShape

const T0 = Date.UTC(2025, 0, 1)
const MIN = 60_000
const HOUR = 60 * MIN
const DAY = 24 * HOUR
const config = Config.defaults
const rule = (budget = 100, cooldownMs = DAY) => ({ budget, cooldownMs })

const ev = (seq: number, phase: PhaseModel.Phase, at: number, kind: PhaseModel.Event["kind"] = "phase"): PhaseModel.Event => ({ seq, kind, phase, at })
const obs = (source: Source.Source, identity: string, remoteAt: number | null): Target.Observation => ({ source, identity, remoteAt })
const auth = (a: Assignment.Assignment, now: number): Store.Authority => ({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now })

const addDevice = (s: S, slots = 4, name = "device") => s.addDevice({ name, slots, tokenHash: `hash-${name}`, now: T0 })

const claimed = (s: S, deviceId: number, slot: number, now: number, extra: Partial<Store.ClaimRequest> = {}) =>
  Effect.flatMap(s.claim({ deviceId, slot, now, config, ...extra }), (a) => (a === null ? Effect.dieMessage("expected a pending target to claim") : Effect.succeed(a)))

const finish = (s: S, a: Assignment.Assignment, now: number, outcome: Assignment.Outcome = "clean") =>
  s.submitResult({ ...auth(a, now), outcome, finalPhase: "awaiting_receipt", body: JSON.stringify({ findings: [] }) })

/** Claims the one pending target and completes its scan. */
const scanOnce = (s: S, deviceId: number, now: number) => Effect.flatMap(claimed(s, deviceId, 0, now), (a) => Effect.as(finish(s, a, now + MIN), a))

/** Every event of a normal run, from `assigned` to `awaiting_receipt`, a minute apart. */
const normalRun = (from: number): ReadonlyArray<PhaseModel.Event> =>
  (["assigned", "permit_wait", "preparing", "acquiring", "scanning", "filtering", "cleanup", "staging", "bundling", "uploading", "awaiting_receipt"] as const).map(
    (p, i) => ev(i + 1, p, from + i * MIN)
  )

const lifecycle = (t: Target.Target) => ({
  status: t.status,
  coveredRemoteAt: t.coveredRemoteAt,
  completedAt: t.completedAt,
  lastScanStartedAt: t.lastScanStartedAt,
  fence: t.fence,
  attempts: t.attempts
})

const failure = <A, E>(self: Effect.Effect<A, E>) =>
  Effect.flip(self) as Effect.Effect<E & { readonly _tag: string; readonly reason?: string; readonly holder?: Errors.SlotHolder }, A>

/**
 * The conformance suite of the Store port: every operation, every storage
 * scenario of the specification, races when the backend has real concurrency,
 * and a model-based comparison with core's in-memory reference.
 *
 * @example
 * // test/my-store.test.ts
 * import { conformance } from "@scanfleet/adapters/Conformance"
 * conformance("my store", () => MyStore.layer(settings), { concurrency: true })
 */
export const conformance = (name: string, makeStore: MakeStore, capabilities: Capabilities) =>
  describe(`Store conformance: ${name}`, () => {
    const test = <A, E>(title: string, body: (s: S) => Effect.Effect<A, E>, timeout?: number) =>
      it.live(title, () => Effect.flatMap(Store.Store, body).pipe(Effect.provide(makeStore())), timeout)

    describe("recording discovery", () => {
      test("inserts new identities as pending in batch order and counts known records", (s) =>
        Effect.gen(function* () {
          const r1 = yield* s.recordObservations([obs("github", "a/x", T0 - DAY), obs("github", "a/y", null), obs("github", "a/x", T0 - HOUR), obs("gitlab", "a/x", null)], T0)
          expect(r1).toEqual({ inserted: ["a/x", "a/y", "a/x"], known: 1 })
          const x = yield* s.getTarget("github", "a/x")
          expect(x).toMatchObject({ source: "github", identity: "a/x", status: "pending", observedRemoteAt: T0 - HOUR, coveredRemoteAt: null, fence: 0, attempts: 0, discoveredAt: T0 })
          const y = yield* s.getTarget("github", "a/y")
          expect(x.id).toBeLessThan(y.id)
          expect((yield* s.getTarget("gitlab", "a/x")).id).toBeGreaterThan(y.id)
          const r2 = yield* s.recordObservations([obs("github", "a/y", T0), obs("github", "a/z", null)], T0 + 1)
          expect(r2).toEqual({ inserted: ["a/z"], known: 1 })
          expect(yield* s.recordObservations([], T0)).toEqual({ inserted: [], known: 0 })
          expect(yield* s.countTargets()).toEqual([
            { source: "github", status: "pending", count: 3 },
            { source: "gitlab", status: "pending", count: 1 }
          ])
        }))

      test("target ids count discovered targets: re-observing known targets, changed or not, draws no id", (s) =>
        Effect.gen(function* () {
          yield* s.recordObservations([obs("github", "n/a", T0 - DAY), obs("github", "n/b", null)], T0)
          const b = yield* s.getTarget("github", "n/b")
          // a repeat of each (one newer, one unchanged), twice, before one new identity in the same batch
          yield* s.recordObservations([obs("github", "n/a", T0 - HOUR), obs("github", "n/b", null)], T0 + 1)
          yield* s.recordObservations([obs("github", "n/a", T0 - HOUR), obs("github", "n/b", null), obs("github", "n/c", null)], T0 + 2)
          expect((yield* s.getTarget("github", "n/a")).observedRemoteAt).toBe(T0 - HOUR)
          expect((yield* s.getTarget("github", "n/c")).id).toBe(b.id + 1)
        }))

      test("Source-specific remote timestamp is retained", (s) =>
        Effect.gen(function* () {
          const pushedAt = Date.parse("2024-05-01T08:00:00Z")
          const activity = Date.parse("2024-06-01T08:00:00Z")
          const modified = Date.parse("2024-07-01T08:00:00Z")
          yield* s.recordObservations([obs("github", "o/r", pushedAt), obs("gitlab", "g/p", activity), obs("huggingface", "spaces/u/s", modified)], T0)
          expect((yield* s.getTarget("github", "o/r")).observedRemoteAt).toBe(pushedAt)
          expect((yield* s.getTarget("gitlab", "g/p")).observedRemoteAt).toBe(activity)
          expect((yield* s.getTarget("huggingface", "spaces/u/s")).observedRemoteAt).toBe(modified)
        }))

      test("observed_remote_at only moves forward: an older or missing value never lowers it", (s) =>
        Effect.gen(function* () {
          yield* s.recordObservations([obs("github", "o/r", T0 - HOUR)], T0)
          yield* s.recordObservations([obs("github", "o/r", T0 - DAY), obs("github", "o/r", null)], T0 + 1)
          expect((yield* s.getTarget("github", "o/r")).observedRemoteAt).toBe(T0 - HOUR)
          yield* s.recordObservations([obs("github", "o/r", T0 - MIN)], T0 + 2)
          expect((yield* s.getTarget("github", "o/r")).observedRemoteAt).toBe(T0 - MIN)
        }))

      test("Missing or malformed remote timestamp", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s)
          const r = yield* s.recordObservations([obs("github", "no/time", null)], T0)
          expect(r.inserted).toEqual(["no/time"])
          yield* scanOnce(s, d.id, T0)
          yield* s.recordObservations([obs("github", "no/time", null)], T0 + 2 * DAY)
          expect(yield* s.promote("github", rule(), T0 + 3 * DAY)).toEqual({ promoted: [], deferred: 0 })
          expect((yield* s.getTarget("github", "no/time")).status).toBe("completed")
        }))

      test("DockerHub discovery", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s)
          yield* s.recordObservations([obs("dockerhub", "library/nginx:latest@sha256:aaa", null)], T0)
          yield* scanOnce(s, d.id, T0)
          const again = yield* s.recordObservations([obs("dockerhub", "library/nginx:latest@sha256:aaa", null)], T0 + 2 * DAY)
          expect(again).toEqual({ inserted: [], known: 1 })
          expect(yield* s.promote("dockerhub", rule(10, 0), T0 + 3 * DAY)).toEqual({ promoted: [], deferred: 0 })
          expect((yield* s.getTarget("dockerhub", "library/nginx:latest@sha256:aaa")).status).toBe("completed")
          // a new digest is a new target
          const fresh = yield* s.recordObservations([obs("dockerhub", "library/nginx:latest@sha256:bbb", null)], T0 + 3 * DAY)
          expect(fresh.inserted).toEqual(["library/nginx:latest@sha256:bbb"])
        }))

      test("Non-completed target is rediscovered", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 8)
          yield* s.recordObservations(["claimed", "failed", "unresolved", "released", "pending"].map((i) => obs("github", i, T0 - DAY)), T0)
          // in progress (claimed, leased, reserved)
          const inProgress = yield* claimed(s, d.id, 0, T0)
          const failed = yield* claimed(s, d.id, 1, T0)
          yield* finish(s, failed, T0 + MIN, "scan_error")
          const unresolved = yield* claimed(s, d.id, 2, T0)
          yield* finish(s, unresolved, T0 + MIN, "unsupported")
          const released = yield* claimed(s, d.id, 3, T0)
          yield* s.release(auth(released, T0 + MIN))
          const ids = [inProgress.identity, failed.identity, unresolved.identity, released.identity, "pending"]
          expect(ids).toEqual(["claimed", "failed", "unresolved", "released", "pending"])
          const before = yield* Effect.forEach(ids, (i) => s.getTarget("github", i))
          expect(before.map((t) => t.status)).toEqual(expect.arrayContaining(["pending", "in_progress", "failed", "unresolved"]))
          yield* s.recordObservations(ids.map((i) => obs("github", i, T0 + HOUR)), T0 + 2 * DAY)
          yield* s.promote("github", rule(100, 0), T0 + 2 * DAY)
          const after = yield* Effect.forEach(ids, (i) => s.getTarget("github", i))
          after.forEach((t, i) => {
            expect(lifecycle(t)).toEqual(lifecycle(before[i]))
            expect(t.observedRemoteAt).toBe(T0 + HOUR)
          })
        }))

      test("records 10,000 observations in one call, then knows all of them", (s) =>
        Effect.gen(function* () {
          const batch = Array.from({ length: 10_000 }, (_, i) => obs("github", `bulk/${i}`, T0 - i))
          const r = yield* s.recordObservations(batch, T0)
          expect(r.inserted.length).toBe(10_000)
          expect(r.inserted[9_999]).toBe("bulk/9999")
          const again = yield* s.recordObservations(batch.map((o) => ({ ...o, remoteAt: T0 })), T0 + 1)
          expect(again).toEqual({ inserted: [], known: 10_000 })
          expect((yield* s.getTarget("github", "bulk/9999")).observedRemoteAt).toBe(T0)
        }), 60_000)
    })

    describe("promotion", () => {
      // One completed target covering `covered`, scanned at T0.
      const completedAt = (s: S, identity: string, covered: number | null) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 1, `dev-${identity}`)
          yield* s.recordObservations([obs("github", identity, covered)], T0)
          const a = yield* scanOnce(s, d.id, T0)
          return a
        })

      test("Completed target changed after its covered revision", (s) =>
        Effect.gen(function* () {
          const a = yield* completedAt(s, "o/r", T0 - DAY)
          expect(a.coveredRemoteAt).toBe(T0 - DAY)
          yield* s.recordObservations([obs("github", "o/r", T0 + HOUR)], T0 + 2 * DAY)
          const before = yield* s.getTarget("github", "o/r")
          expect(yield* s.promote("github", rule(), T0 + 2 * DAY)).toEqual({ promoted: ["o/r"], deferred: 0 })
          const t = yield* s.getTarget("github", "o/r")
          expect(t.status).toBe("pending")
          expect(t.fence).toBe(before.fence + 1)
          // one normal fenced scan, covering the newer revision
          const again = yield* claimed(s, a.deviceId, 0, T0 + 2 * DAY)
          expect(again.coveredRemoteAt).toBe(T0 + HOUR)
          expect(again.fence).toBe(t.fence + 1)
          expect(yield* s.promote("github", rule(), T0 + 3 * DAY)).toEqual({ promoted: [], deferred: 0 })
        }))

      test("Unchanged target is rediscovered", (s) =>
        Effect.gen(function* () {
          const a = yield* completedAt(s, "o/r", T0 - DAY)
          const before = yield* s.getTarget("github", "o/r")
          yield* s.recordObservations([obs("github", "o/r", T0 - DAY), obs("github", "o/r", T0 - 2 * DAY)], T0 + 2 * DAY)
          expect(yield* s.promote("github", rule(), T0 + 2 * DAY)).toEqual({ promoted: [], deferred: 0 })
          expect(yield* s.getTarget("github", "o/r")).toEqual(before)
          expect(yield* s.claim({ deviceId: a.deviceId, slot: 0, now: T0 + 2 * DAY, config })).toBeNull()
        }))

      test("Legacy completed target is first observed", (s) =>
        Effect.gen(function* () {
          // scanned without any observation: no covered snapshot, only a completion time
          const a = yield* completedAt(s, "legacy/old", null)
          const done = T0 + MIN
          expect((yield* s.getTarget("github", "legacy/old")).coveredRemoteAt).toBeNull()
          yield* s.recordObservations([obs("github", "legacy/old", done)], T0 + 2 * DAY)
          expect((yield* s.promote("github", rule(), T0 + 2 * DAY)).promoted).toEqual([])
          yield* s.recordObservations([obs("github", "legacy/old", done + 1)], T0 + 2 * DAY)
          expect((yield* s.promote("github", rule(), T0 + 2 * DAY)).promoted).toEqual(["legacy/old"])
          expect(a.coveredRemoteAt).toBeNull()
        }))

      test("Update arrives during a scan", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 1)
          yield* s.recordObservations([obs("github", "o/r", T0 - DAY)], T0)
          const a = yield* claimed(s, d.id, 0, T0)
          expect(a.coveredRemoteAt).toBe(T0 - DAY)
          // discovery records a newer revision while the scan runs
          yield* s.recordObservations([obs("github", "o/r", T0 + 5 * MIN)], T0 + 6 * MIN)
          yield* finish(s, a, T0 + 10 * MIN)
          const done = yield* s.getTarget("github", "o/r")
          expect(done).toMatchObject({ status: "completed", observedRemoteAt: T0 + 5 * MIN, coveredRemoteAt: T0 - DAY })
          // not before the cooldown
          expect(yield* s.promote("github", rule(10, DAY), T0 + HOUR)).toEqual({ promoted: [], deferred: 0 })
          // exactly one follow-up after it
          expect(yield* s.promote("github", rule(10, DAY), T0 + DAY)).toEqual({ promoted: ["o/r"], deferred: 0 })
          const follow = yield* claimed(s, d.id, 0, T0 + DAY)
          expect(follow.coveredRemoteAt).toBe(T0 + 5 * MIN)
          yield* finish(s, follow, T0 + DAY + MIN)
          expect(yield* s.promote("github", rule(10, 0), T0 + 3 * DAY)).toEqual({ promoted: [], deferred: 0 })
        }))

      // Five targets scanned one hour apart (t0 the stalest), each then changed remotely.
      const fiveChanged = (s: Store.StoreShape) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 1)
          for (let i = 0; i < 5; i++) {
            yield* s.recordObservations([obs("github", `t${i}`, T0 - DAY)], T0 + i * HOUR)
            yield* scanOnce(s, d.id, T0 + i * HOUR)
          }
          yield* s.recordObservations([0, 1, 2, 3, 4].map((i) => obs("github", `t${i}`, T0 + 10 * HOUR)), T0 + 11 * HOUR)
        })

      test("Eligible changes exceed the cycle budget", (s) =>
        Effect.gen(function* () {
          yield* fiveChanged(s)
          const now = T0 + 3 * DAY
          expect(yield* s.promote("github", rule(2), now)).toEqual({ promoted: ["t0", "t1"], deferred: 3 })
          expect((yield* s.getTarget("github", "t2")).status).toBe("completed")
          expect(yield* s.promote("github", rule(2), now)).toEqual({ promoted: ["t2", "t3"], deferred: 1 })
          expect(yield* s.promote("github", rule(0), now)).toEqual({ promoted: [], deferred: 1 })
          expect(yield* s.promote("github", rule(2), now)).toEqual({ promoted: ["t4"], deferred: 0 })
        }))

      test("the deferred count stops at its limit, which then reads as at least", (s) =>
        Effect.gen(function* () {
          yield* fiveChanged(s)
          const now = T0 + 3 * DAY
          expect(yield* s.promote("github", { ...rule(1), deferredLimit: 2 }, now)).toEqual({ promoted: ["t0"], deferred: 2 })
          expect(yield* s.promote("github", { ...rule(1), deferredLimit: 5 }, now)).toEqual({ promoted: ["t1"], deferred: 3 })
          expect(yield* s.promote("github", { ...rule(0), deferredLimit: 0 }, now)).toEqual({ promoted: [], deferred: 0 })
          expect(yield* s.promote("github", rule(0), now)).toEqual({ promoted: [], deferred: 3 })
        }))

      test("Cooldown has not elapsed", (s) =>
        Effect.gen(function* () {
          yield* completedAt(s, "o/r", T0 - DAY)
          yield* s.recordObservations([obs("github", "o/r", T0 + HOUR)], T0 + 2 * HOUR)
          expect(yield* s.promote("github", rule(10, DAY), T0 + DAY - 1)).toEqual({ promoted: [], deferred: 0 })
          expect((yield* s.getTarget("github", "o/r")).status).toBe("completed")
          expect(yield* s.promote("github", rule(10, DAY), T0 + DAY)).toEqual({ promoted: ["o/r"], deferred: 0 })
        }))

      test("Concurrent discovery cycles", (s) =>
        Effect.gen(function* () {
          yield* completedAt(s, "o/r", T0 - DAY)
          yield* s.recordObservations([obs("github", "o/r", T0 + HOUR)], T0 + 2 * DAY)
          const cycles = yield* Effect.all(
            Array.from({ length: 8 }, () => s.promote("github", rule(), T0 + 2 * DAY)),
            { concurrency: "unbounded" }
          )
          expect(cycles.flatMap((c) => c.promoted)).toEqual(["o/r"])
          const t = yield* s.getTarget("github", "o/r")
          expect(t.fence).toBe(2)
        }))

      test("Cycle admits new and updated targets", (s) =>
        Effect.gen(function* () {
          yield* completedAt(s, "old/changed", T0 - DAY)
          const now = T0 + 2 * DAY
          const rec = yield* s.recordObservations([obs("github", "old/changed", T0 + HOUR), obs("github", "new/one", T0), obs("github", "new/two", null)], now)
          const pro = yield* s.promote("github", rule(), now)
          const counts = Discovery.counts(new Set(rec.inserted), new Set(pro.promoted))
          expect(counts).toEqual({ queuedNewCount: 2, queuedUpdatedCount: 1 })
          const cycle = yield* s.recordCycle({ source: "github", startedAt: now, endedAt: now + 1000, pages: 1, results: 3, malformed: 0, ...counts, deferredCount: pro.deferred, stopReason: "end_of_listing", error: null })
          expect(yield* s.listCycles({ source: "github", limit: 10 })).toEqual([cycle])
        }))

      test("No changed targets are promoted", (s) =>
        Effect.gen(function* () {
          yield* completedAt(s, "old/same", T0 - DAY)
          const now = T0 + 2 * DAY
          const rec = yield* s.recordObservations([obs("github", "old/same", T0 - DAY)], now)
          const pro = yield* s.promote("github", rule(), now)
          const counts = Discovery.counts(new Set(rec.inserted), new Set(pro.promoted))
          const cycle = yield* s.recordCycle({ source: "github", startedAt: now, endedAt: now, pages: 1, results: 1, malformed: 0, ...counts, deferredCount: 0, stopReason: "page_limit", error: null })
          expect(cycle.queuedUpdatedCount).toBe(0)
          expect((yield* s.listCycles({ limit: 1 }))[0].queuedUpdatedCount).toBe(0)
        }))
    })

    describe("claims", () => {
      test("Revision-aware target is claimed", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 2)
          yield* s.recordObservations([obs("github", "o/r", T0 - DAY)], T0)
          yield* s.recordObservations([obs("github", "o/r", T0 - HOUR), obs("github", "o/r", T0 - 2 * HOUR)], T0 + 1)
          const a = yield* claimed(s, d.id, 1, T0 + MIN)
          expect(a.coveredRemoteAt).toBe(T0 - HOUR)
          const t = yield* s.getTarget("github", "o/r")
          expect(t).toMatchObject({ status: "in_progress", coveredRemoteAt: T0 - HOUR, fence: 1, attempts: 1, lastScanStartedAt: T0 + MIN })
          expect(a).toMatchObject({ targetId: t.id, identity: "o/r", deviceId: d.id, slot: 1, fence: 1, state: "active", lastSeq: 0, lastPhase: null })
          expect(yield* s.getAssignment(a.reservationId)).toEqual(a)
        }))

      test("Claim fails before authority is committed", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 1)
          yield* s.recordObservations([obs("github", "first", T0 - DAY), obs("github", "second", T0 - DAY)], T0)
          const held = yield* claimed(s, d.id, 0, T0)
          yield* s.recordObservations([obs("github", "second", T0 - HOUR)], T0 + 1)
          const before = yield* s.getTarget("github", "second")
          // the refusal names the device's own reservation on the slot, so a device that lost its answer can give it back
          expect(yield* failure(s.claim({ deviceId: d.id, slot: 0, now: T0 + 2, config }))).toMatchObject({
            reason: "slot_busy",
            holder: { reservationId: held.reservationId, fence: held.fence }
          })
          expect((yield* failure(s.claim({ deviceId: d.id, slot: 1, now: T0 + 2, config }))).reason).toBe("capacity")
          expect((yield* failure(s.claim({ deviceId: 999, slot: 0, now: T0 + 2, config }))).reason).toBe("unknown_device")
          const other = yield* addDevice(s, 1, "revoked")
          yield* s.revokeDevice(other.id, T0 + 1)
          const e = yield* failure(s.claim({ deviceId: other.id, slot: 0, now: T0 + 2, config }))
          expect(e).toMatchObject({ _tag: "ClaimRejected", reason: "unknown_device" })
          const after = yield* s.getTarget("github", "second")
          expect(after).toEqual(before)
          expect(after.coveredRemoteAt).toBeNull()
          expect(yield* s.listAssignments({ limit: 10 })).toHaveLength(1)
        }))

      test("claims the lowest-id pending target, within the allowed sources and the per-source cap", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 4)
          yield* s.recordObservations([obs("gitlab", "g1", null), obs("github", "h1", null), obs("github", "h2", null), obs("gitlab", "g2", null)], T0)
          expect((yield* claimed(s, d.id, 0, T0, { sources: ["github"] })).identity).toBe("h1")
          expect((yield* claimed(s, d.id, 1, T0, { sourceCap: 1 })).identity).toBe("g1")
          // both sources are at the cap of one
          expect(yield* s.claim({ deviceId: d.id, slot: 2, now: T0, config, sourceCap: 1 })).toBeNull()
          expect(yield* s.claim({ deviceId: d.id, slot: 2, now: T0, config, sources: ["huggingface"] })).toBeNull()
          expect((yield* claimed(s, d.id, 2, T0, { sourceCap: 2 })).identity).toBe("h2")
          expect((yield* claimed(s, d.id, 3, T0)).identity).toBe("g2")
        }))

      // Found by the model-based test: a source with nothing in flight still counts against a cap of zero.
      test("a per-source cap of zero admits no claim", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 1)
          yield* s.recordObservations([obs("github", "a", null)], T0)
          expect(yield* s.claim({ deviceId: d.id, slot: 0, now: T0, config, sourceCap: 0 })).toBeNull()
          expect((yield* s.getTarget("github", "a")).status).toBe("pending")
        }))

      test("Source override exists", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 1)
          const withOverride: Config.ManagedConfig = { ...config, assignments: { ...config.assignments, overrides: { dockerhub: { ttlSeconds: 7200 } } } }
          yield* s.recordObservations([obs("dockerhub", "library/redis@sha256:1", null)], T0)
          const a = yield* claimed(s, d.id, 0, T0, { config: withOverride })
          expect(a.policy).toEqual({ source: "dockerhub", origin: "override", ttlSeconds: 7200, scanTimeoutSeconds: 2700, uploadTimeoutSeconds: 600, handoffMarginSeconds: 60 })
          expect(a.expiresAt).toBe(T0 + 7200 * 1000)
          expect(a.scanDeadline).toBe(T0 + 2700 * 1000)
          expect(a.uploadDeadline).toBe(T0 + 3300 * 1000)
          expect((yield* s.getAssignment(a.reservationId)).policy).toEqual(a.policy)
        }))

      test("Source override is absent", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 1)
          yield* s.recordObservations([obs("gitlab", "g/p", null)], T0)
          const a = yield* claimed(s, d.id, 0, T0)
          expect(a.policy.origin).toBe("global")
          expect(a.expiresAt).toBe(T0 + config.assignments.globalTtlSeconds * 1000)
        }))

      // A store may keep a policy once and refer to it: each reservation still reads back the policy it was issued under.
      test("claims under two configurations keep each its own policy and deadlines, in every read", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 6)
          const other: Config.ManagedConfig = {
            ...config,
            assignments: { ...config.assignments, globalTtlSeconds: 5400, overrides: { dockerhub: { ttlSeconds: 9000 } } },
            sources: { ...config.sources, github: { ...config.sources.github, scanTimeoutSeconds: 900 } }
          }
          // equal in content to `config`, another object
          const copy: Config.ManagedConfig = JSON.parse(JSON.stringify(config))
          yield* s.recordObservations([...["a", "b", "c", "d"].map((i) => obs("github", i, null)), obs("dockerhub", "x", null), obs("github", "e", null)], T0)
          const a = yield* claimed(s, d.id, 0, T0)
          const b = yield* claimed(s, d.id, 1, T0 + 1, { config: other })
          const c = yield* claimed(s, d.id, 2, T0 + 2)
          const [e, x] = yield* s.claimMany({ deviceId: d.id, slots: [3, 4], now: T0 + 3, config: other })
          const f = yield* claimed(s, d.id, 5, T0 + 4, { config: copy })
          const issued: ReadonlyArray<readonly [Assignment.Assignment, Config.ManagedConfig]> = [[a, config], [b, other], [c, config], [e, other], [x, other], [f, copy]]
          expect(issued.map(([i]) => i.identity)).toEqual(["a", "b", "c", "d", "x", "e"])
          for (const [i, cfg] of issued) {
            const { policy, deadlines } = Deadline.issueFor(cfg, i.source, i.issuedAt)
            expect(i).toMatchObject({ policy, ...deadlines })
            expect(yield* s.getAssignment(i.reservationId)).toEqual(i)
          }
          expect(b.policy).not.toEqual(a.policy)
          expect(x.policy).toMatchObject({ source: "dockerhub", origin: "override", ttlSeconds: 9000 })
          expect(yield* s.listAssignments({ limit: 10 })).toEqual([...issued.map(([i]) => i)].sort((p, q) => q.reservationId - p.reservationId))
          // the result rewrites the reservation; its policy stays
          yield* finish(s, b, T0 + MIN)
          expect(yield* s.getAssignment(b.reservationId)).toMatchObject({ state: "completed", policy: b.policy, expiresAt: b.expiresAt })
        }))

      test("returns null when nothing is pending", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 1)
          expect(yield* s.claim({ deviceId: d.id, slot: 0, now: T0, config })).toBeNull()
        }))

      test("a batch claim gives the listed slots the lowest pending ids, in their order, as single claims would", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 4)
          yield* s.recordObservations([obs("github", "b1", T0 - DAY), obs("gitlab", "b2", null), obs("github", "b3", T0 - HOUR)], T0)
          const as = yield* s.claimMany({ deviceId: d.id, slots: [2, 0, 3, 1], now: T0 + MIN, config })
          expect(as.map((a) => [a.slot, a.identity])).toEqual([[2, "b1"], [0, "b2"], [3, "b3"]])
          for (const a of as) {
            expect(a).toMatchObject({ deviceId: d.id, fence: 1, state: "active", issuedAt: T0 + MIN })
            expect(yield* s.getAssignment(a.reservationId)).toEqual(a)
            expect(yield* s.getTarget(a.source, a.identity)).toMatchObject({ status: "in_progress", fence: 1, attempts: 1, lastScanStartedAt: T0 + MIN })
          }
          expect(as[0].coveredRemoteAt).toBe(T0 - DAY)
          expect(as[1].policy.source).toBe("gitlab")
          // the queue is empty now; the last free slot gets nothing, and an empty list claims nothing
          expect(yield* s.claimMany({ deviceId: d.id, slots: [1], now: T0 + MIN, config })).toEqual([])
          expect(yield* s.claimMany({ deviceId: d.id, slots: [], now: T0 + MIN, config })).toEqual([])
        }))

      test("a refused batch claim changes nothing and gives the first reason a single claim would", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 3)
          yield* s.recordObservations(["r1", "r2", "r3", "r4"].map((i) => obs("github", i, null)), T0)
          const held = yield* claimed(s, d.id, 1, T0)
          const before = yield* s.countTargets()
          const reason = (slots: ReadonlyArray<number>, deviceId = d.id) => Effect.map(failure(s.claimMany({ deviceId, slots, now: T0 + 1, config })), (e) => e.reason)
          expect(yield* reason([0, 1])).toBe("slot_busy")
          expect((yield* failure(s.claimMany({ deviceId: d.id, slots: [0, 1], now: T0 + 1, config }))).holder).toEqual({ reservationId: held.reservationId, fence: held.fence })
          expect(yield* reason([0, 0])).toBe("slot_busy")
          // a slot listed twice is busy with no reservation of its own to name
          expect((yield* failure(s.claimMany({ deviceId: d.id, slots: [0, 0], now: T0 + 1, config }))).holder).toBeUndefined()
          expect(yield* reason([0, 3])).toBe("capacity")
          expect(yield* reason([2, -1, 1])).toBe("capacity")
          expect(yield* reason([0.5])).toBe("capacity")
          expect(yield* reason([0], 999)).toBe("unknown_device")
          const other = yield* addDevice(s, 2, "revoked")
          yield* s.revokeDevice(other.id, T0)
          expect(yield* reason([0], other.id)).toBe("unknown_device")
          expect(yield* s.countTargets()).toEqual(before)
          expect(yield* s.listAssignments({ limit: 10 })).toHaveLength(1)
          expect((yield* s.claimMany({ deviceId: d.id, slots: [2, 0], now: T0 + 2, config })).map((a) => [a.slot, a.identity])).toEqual([[2, "r2"], [0, "r3"]])
        }))

      test("a batch claim keeps to the allowed sources and counts its own claims against the per-source cap", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 6)
          yield* s.recordObservations([obs("github", "c1", null), obs("github", "c2", null), obs("gitlab", "c3", null), obs("github", "c4", null), obs("gitlab", "c5", null)], T0)
          expect((yield* s.claimMany({ deviceId: d.id, slots: [0, 1, 2], now: T0, config, sourceCap: 1 })).map((a) => a.identity)).toEqual(["c1", "c3"])
          expect((yield* s.claimMany({ deviceId: d.id, slots: [2, 3], now: T0, config, sources: ["gitlab"] })).map((a) => a.identity)).toEqual(["c5"])
          expect((yield* s.claimMany({ deviceId: d.id, slots: [3, 4, 5], now: T0, config, sourceCap: 0 }))).toEqual([])
          expect((yield* s.claimMany({ deviceId: d.id, slots: [3, 4, 5], now: T0, config })).map((a) => [a.slot, a.identity])).toEqual([[3, "c2"], [4, "c4"]])
        }))
    })

    describe("progress", () => {
      const active = (s: S) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 2)
          yield* s.recordObservations([obs("github", "o/r", T0 - DAY)], T0)
          return yield* claimed(s, d.id, 0, T0)
        })

      test("Progress is accepted", (s) =>
        Effect.gen(function* () {
          const a = yield* active(s)
          const r = yield* s.appendProgress(auth(a, T0 + MIN), [ev(1, "assigned", T0 + 1000), ev(2, "permit_wait", T0 + 2000)])
          expect(r.results).toEqual([
            { seq: 1, status: "accepted", acceptedAt: T0 + MIN },
            { seq: 2, status: "accepted", acceptedAt: T0 + MIN }
          ])
          expect(r.assignment).toMatchObject({ lastPhase: "permit_wait", lastSeq: 2, lastProgressAt: T0 + MIN })
          const stored = yield* s.getAssignment(a.reservationId)
          expect(stored).toEqual(r.assignment)
          // neither expiry nor ownership changed
          expect({ ...stored, lastPhase: null, lastSeq: 0, lastProgressAt: null }).toEqual(a)
          expect(yield* s.timeline(a.reservationId)).toEqual([
            { ...ev(1, "assigned", T0 + 1000), acceptedAt: T0 + MIN },
            { ...ev(2, "permit_wait", T0 + 2000), acceptedAt: T0 + MIN }
          ])
        }))

      test("Duplicate progress is retried", (s) =>
        Effect.gen(function* () {
          const a = yield* active(s)
          yield* s.appendProgress(auth(a, T0 + MIN), [ev(1, "assigned", T0 + 1000)])
          const retry = yield* s.appendProgress(auth(a, T0 + 2 * MIN), [ev(1, "assigned", T0 + 1000), { ...ev(2, "preparing", T0 + 3000), detail: "resolving" }])
          expect(retry.results).toEqual([
            { seq: 1, status: "duplicate", acceptedAt: T0 + MIN },
            { seq: 2, status: "accepted", acceptedAt: T0 + 2 * MIN }
          ])
          const again = yield* s.appendProgress(auth(a, T0 + 3 * MIN), [{ ...ev(2, "preparing", T0 + 3000), detail: "resolving" }])
          expect(again.results).toEqual([{ seq: 2, status: "duplicate", acceptedAt: T0 + 2 * MIN }])
          expect(again.assignment.lastProgressAt).toBe(T0 + 2 * MIN)
          const tl = yield* s.timeline(a.reservationId)
          expect(tl.map((e) => e.seq)).toEqual([1, 2])
          expect(tl[1].detail).toBe("resolving")
        }))

      test("refuses a conflicting resubmission, a gap, an illegal move and anything after a terminal phase", (s) =>
        Effect.gen(function* () {
          const a = yield* active(s)
          yield* s.appendProgress(auth(a, T0 + MIN), [ev(1, "assigned", T0)])
          expect(yield* failure(s.appendProgress(auth(a, T0 + MIN), [ev(1, "preparing", T0)]))).toMatchObject({ _tag: "ProgressRejected", reason: "conflict", seq: 1 })
          expect(yield* failure(s.appendProgress(auth(a, T0 + MIN), [ev(3, "preparing", T0)]))).toMatchObject({ _tag: "ProgressRejected", reason: "sequence_gap" })
          // a batch is refused whole: its valid first event is not stored either
          expect(yield* failure(s.appendProgress(auth(a, T0 + MIN), [ev(2, "scanning", T0), ev(3, "preparing", T0)]))).toMatchObject({ reason: "illegal_transition", seq: 3 })
          expect(yield* failure(s.appendProgress(auth(a, T0 + MIN), [ev(2, "acquiring", T0, "recovered")]))).toMatchObject({ reason: "illegal_transition" })
          yield* s.appendProgress(auth(a, T0 + MIN), [ev(2, "failed", T0)])
          expect(yield* failure(s.appendProgress(auth(a, T0 + MIN), [ev(3, "failed", T0)]))).toMatchObject({ reason: "terminal" })
          expect((yield* s.timeline(a.reservationId)).map((e) => e.phase)).toEqual(["assigned", "failed"])
        }))

      test("bounds a timeline: recoveries up to PhaseModel.lastRecoverySeq, then room for every remaining phase within PhaseModel.maxSeq", (s) =>
        Effect.gen(function* () {
          const a = yield* active(s)
          const last = PhaseModel.lastRecoverySeq
          const recoveries = Array.from({ length: last - 1 }, (_, i) => ev(i + 2, "assigned", T0 + i, "recovered"))
          yield* s.appendProgress(auth(a, T0 + MIN), [ev(1, "assigned", T0), ...recoveries])
          expect(yield* failure(s.appendProgress(auth(a, T0 + MIN), [ev(last + 1, "assigned", T0, "recovered")]))).toMatchObject({
            _tag: "ProgressRejected",
            reason: "illegal_transition",
            seq: last + 1
          })
          const rest = [...PhaseModel.scanStage, ...PhaseModel.uploadStage, "failed" as const].map((p, i) => ev(last + 1 + i, p, T0 + MIN))
          yield* s.appendProgress(auth(a, T0 + MIN), rest)
          const tl = yield* s.timeline(a.reservationId)
          expect(tl).toHaveLength(last + rest.length)
          expect(tl.at(-1)).toMatchObject({ phase: "failed" })
          expect(tl.at(-1)!.seq).toBeLessThanOrEqual(PhaseModel.maxSeq)
        }))

      test("refuses writes that are not the device's live reservation", (s) =>
        Effect.gen(function* () {
          const a = yield* active(s)
          const e1 = yield* failure(s.appendProgress({ ...auth(a, T0), reservationId: 4242 }, [ev(1, "assigned", T0)]))
          expect(e1).toMatchObject({ _tag: "ReservationRefused", reason: "not_found" })
          expect(yield* failure(s.appendProgress({ ...auth(a, T0), deviceId: a.deviceId + 1 }, [ev(1, "assigned", T0)]))).toMatchObject({ reason: "not_owner" })
          expect(yield* failure(s.appendProgress({ ...auth(a, T0), fence: a.fence - 1 }, [ev(1, "assigned", T0)]))).toMatchObject({ reason: "stale_fence" })
          expect(yield* failure(s.appendProgress(auth(a, a.expiresAt), [ev(1, "assigned", T0)]))).toMatchObject({ reason: "expired" })
          yield* s.appendProgress(auth(a, T0 + 1), [ev(1, "assigned", T0)])
          yield* s.release(auth(a, T0 + 2))
          expect(yield* failure(s.appendProgress(auth(a, T0 + 3), [ev(2, "preparing", T0)]))).toMatchObject({ reason: "not_active" })
          // a retry of an accepted event is still answered after the reservation ended
          expect((yield* s.appendProgress(auth(a, T0 + 3), [ev(1, "assigned", T0)])).results[0]).toMatchObject({ status: "duplicate", acceptedAt: T0 + 1 })
        }))

      test("Operator inspects active work", (s) =>
        Effect.gen(function* () {
          const a = yield* active(s)
          yield* s.appendProgress(auth(a, T0 + 5 * MIN), [ev(1, "assigned", T0), ev(2, "scanning", T0 + MIN)])
          const [shown] = yield* s.listAssignments({ state: "active", limit: 10 })
          // the three immutable deadlines are stored apart, with the current phase
          expect(shown).toMatchObject({ reservationId: a.reservationId, lastPhase: "scanning", scanDeadline: a.scanDeadline, uploadDeadline: a.uploadDeadline, expiresAt: a.expiresAt })
          expect(new Set([shown.scanDeadline, shown.uploadDeadline, shown.expiresAt]).size).toBe(3)
          expect(Deadline.next(shown, T0 + 10 * MIN)).toEqual({ which: "scanDeadline", label: "target-scan deadline", at: a.scanDeadline, remainingMs: a.scanDeadline - (T0 + 10 * MIN) })
          expect(Deadline.next(shown, a.scanDeadline)).toMatchObject({ which: "uploadDeadline", label: "result-upload deadline" })
        }))

      test("Process restarts during an assignment", (s) =>
        Effect.gen(function* () {
          const a = yield* active(s)
          yield* s.appendProgress(auth(a, T0 + 1), [ev(1, "assigned", T0), ev(2, "scanning", T0 + 10)])
          const before = yield* s.timeline(a.reservationId)
          yield* s.appendProgress(auth(a, T0 + 2), [ev(3, "scanning", T0 + 20, "recovered"), ev(4, "cleanup", T0 + 30)])
          const after = yield* s.timeline(a.reservationId)
          expect(after.slice(0, 2)).toEqual(before)
          expect(after.map((e) => [e.seq, e.kind, e.phase])).toEqual([
            [1, "phase", "assigned"],
            [2, "phase", "scanning"],
            [3, "recovered", "scanning"],
            [4, "phase", "cleanup"]
          ])
        }))
    })

    describe("results, release and expiry", () => {
      const active = (s: S, slots = 2) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, slots)
          yield* s.recordObservations([obs("github", "o/r", T0 - DAY)], T0)
          return yield* claimed(s, d.id, 0, T0)
        })

      test("a batch of results is judged result by result, as submitResult judges each", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 4)
          yield* s.recordObservations(["x0", "x1", "x2", "x3"].map((i) => obs("github", i, T0 - DAY)), T0)
          const [a, b, c, e] = yield* s.claimMany({ deviceId: d.id, slots: [0, 1, 2, 3], now: T0, config })
          const run = normalRun(T0 + 1000)
          for (const x of [a, c]) yield* s.appendProgress(auth(x, T0 + 15 * MIN), run)
          const at = T0 + 20 * MIN
          const result = (x: Assignment.Assignment, outcome: Assignment.Outcome, over: Partial<Store.ResultInput> = {}): Store.ResultInput => ({
            ...auth(x, at),
            outcome,
            finalPhase: "awaiting_receipt",
            body: JSON.stringify({ findings: [] }),
            ...over
          })
          const answers = yield* s.submitResults([
            result(a, "findings"),
            result(b, "clean", { fence: b.fence - 1 }),
            result(c, "scan_error"),
            result(a, "clean", { now: at + MIN }),
            result(e, "clean", { now: e.uploadDeadline + 1 })
          ])
          const receipt = (x: Assignment.Assignment, outcome: Assignment.Outcome) => ({ receiptId: `rc-${x.reservationId}-${x.fence}`, reservationId: x.reservationId, outcome, acceptedAt: at })
          expect(answers.map((r) => (Either.isRight(r) ? r.right : r.left.reason))).toEqual([
            receipt(a, "findings"),
            "stale_fence",
            receipt(c, "scan_error"),
            // a repeat in the same batch returns the original receipt
            receipt(a, "findings"),
            "upload_deadline_passed"
          ])
          expect(yield* s.getAssignment(a.reservationId)).toMatchObject({ state: "completed", outcome: "findings", finalPhase: "awaiting_receipt", endedAt: at })
          expect(yield* s.getAssignment(c.reservationId)).toMatchObject({ state: "failed", outcome: "scan_error", endedAt: at })
          for (const x of [b, e]) expect((yield* s.getAssignment(x.reservationId)).state).toBe("active")
          expect(yield* s.getTarget("github", a.identity)).toMatchObject({ status: "completed", completedAt: at })
          expect((yield* s.getTarget("github", c.identity)).status).toBe(Assignment.targetStatusAfter("scan_error"))
          expect(yield* s.getTarget("github", b.identity)).toMatchObject({ status: "in_progress", completedAt: null })
          // durations are recorded per accepted result, from its own timeline
          const p = yield* s.percentiles({ from: T0, to: T0 + DAY, minSamples: 1 })
          const count = (metric: string, outcome: string) => p.find((r) => r.metric === metric && r.outcome === outcome)?.count ?? 0
          expect([count("end_to_end", "findings"), count("end_to_end", "scan_error"), count("scanning", "findings"), count("upload", "scan_error")]).toEqual([1, 1, 1, 1])
          expect(p.reduce((n, r) => n + r.count, 0)).toBe(10)
          expect(yield* s.submitResults([])).toEqual([])
        }))

      test("Assignment completes normally", (s) =>
        Effect.gen(function* () {
          const a = yield* active(s)
          const run = normalRun(T0 + 1000)
          for (const e of run) yield* s.appendProgress(auth(a, e.at + 500), [e])
          const acceptedAt = T0 + 20 * MIN
          const receipt = yield* finish(s, a, acceptedAt, "findings")
          expect(receipt).toEqual({ receiptId: `rc-${a.reservationId}-${a.fence}`, reservationId: a.reservationId, outcome: "findings", acceptedAt })
          // a resubmission returns the original receipt, known as a repeat even in the same millisecond
          expect(WorkerWrite.isRepeat(receipt)).toBe(false)
          const again = yield* finish(s, a, acceptedAt, "clean")
          expect(again).toEqual(receipt)
          expect(WorkerWrite.isRepeat(again)).toBe(true)
          const batched = yield* s.submitResults([{ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: acceptedAt, outcome: "clean", finalPhase: null, body: "{}" }])
          expect(batched.map((r) => Either.isRight(r) && WorkerWrite.isRepeat(r.right))).toEqual([true])
          expect(yield* finish(s, a, acceptedAt + MIN, "clean")).toEqual(receipt)
          expect(yield* s.getAssignment(a.reservationId)).toMatchObject({ state: "completed", outcome: "findings", finalPhase: "awaiting_receipt", endedAt: acceptedAt })
          expect((yield* s.getTarget("github", "o/r"))).toMatchObject({ status: "completed", completedAt: acceptedAt })
          const tl = yield* s.timeline(a.reservationId)
          expect(tl.map((e) => e.phase)).toEqual(run.map((e) => e.phase))
          const p = yield* s.percentiles({ from: T0, to: T0 + DAY, minSamples: 1 })
          const values = Object.fromEntries(p.map((r) => [r.metric, r.p50.status === "ok" ? r.p50.value : null]))
          const want = { end_to_end: 20 * MIN, scanning: MIN, cleanup: MIN, bundling: MIN, upload: acceptedAt - (run[9].at + 500) }
          expect(Object.keys(values).sort()).toEqual(Object.keys(want).sort())
          // percentiles are within Percentile.accuracy of the exact durations
          for (const [m, v] of Object.entries(want)) expect(Math.abs((values[m] ?? 0) - v), m).toBeLessThanOrEqual(Percentile.accuracy * v)
        }))

      test("a result with its slot's next claim is accepted as submitResult accepts it, then claims as claim does", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 2)
          yield* s.recordObservations(["n0", "n1", "n2"].map((i) => obs("github", i, T0 - DAY)), T0)
          const a = yield* claimed(s, d.id, 0, T0)
          const at = T0 + MIN
          const result = (x: Assignment.Assignment, over: Partial<Store.ResultInput> = {}): Store.ResultInput => ({
            ...auth(x, at),
            outcome: "clean",
            finalPhase: "awaiting_receipt",
            body: JSON.stringify({ findings: [] }),
            ...over
          })
          // a refused result fails as submitResult fails, and claims nothing
          expect(yield* failure(s.submitResultAndClaim(result(a, { fence: a.fence - 1 }), { slot: 0, config }))).toMatchObject({ _tag: "ReservationRefused", reason: "stale_fence" })
          expect((yield* s.listAssignments({ state: "active", limit: 10 })).map((x) => x.reservationId)).toEqual([a.reservationId])
          const done = yield* s.submitResultAndClaim(result(a), { slot: 0, config })
          const receipt = { receiptId: `rc-${a.reservationId}-${a.fence}`, reservationId: a.reservationId, outcome: "clean", acceptedAt: at }
          expect(done.receipt).toEqual(receipt)
          expect(WorkerWrite.isRepeat(done.receipt)).toBe(false)
          expect(done.claimRefused).toBeNull()
          const next = done.next!
          expect(next).toMatchObject({ deviceId: d.id, slot: 0, state: "active", issuedAt: at, source: "github" })
          expect(next.identity).not.toBe(a.identity)
          expect(yield* s.getAssignment(next.reservationId)).toEqual(next)
          expect(yield* s.getAssignment(a.reservationId)).toMatchObject({ state: "completed", outcome: "clean", endedAt: at })
          expect(yield* s.getTarget("github", a.identity)).toMatchObject({ status: "completed", completedAt: at })
          expect(yield* s.getTarget("github", next.identity)).toMatchObject({ status: "in_progress", fence: next.fence, lastScanStartedAt: at })
          // a repeated result returns its receipt again; the claim that follows finds the slot held, and says by which reservation
          const again = yield* s.submitResultAndClaim(result(a, { now: at + 1 }), { slot: 0, config })
          expect(again.receipt).toEqual(receipt)
          expect(WorkerWrite.isRepeat(again.receipt)).toBe(true)
          expect(again.next).toBeNull()
          expect(again.claimRefused).toMatchObject({ _tag: "ClaimRejected", reason: "slot_busy", holder: { reservationId: next.reservationId, fence: next.fence } })
          // a refused claim leaves the result accepted
          const outside = yield* s.submitResultAndClaim(result(next, { outcome: "scan_error" }), { slot: 2, config })
          expect(outside).toMatchObject({ receipt: { reservationId: next.reservationId, outcome: "scan_error" }, next: null, claimRefused: { reason: "capacity" } })
          expect(yield* s.getAssignment(next.reservationId)).toMatchObject({ state: "failed", outcome: "scan_error" })
          // the claim takes only what is pending: the last target, then nothing
          const third = (yield* s.submitResultAndClaim(result(a, { now: at + 2 }), { slot: 1, config })).next!
          expect(third).toMatchObject({ slot: 1, identity: "n2" })
          expect(yield* s.submitResultAndClaim(result(third), { slot: 1, config })).toMatchObject({ next: null, claimRefused: null })
          const p = yield* s.percentiles({ from: T0, to: T0 + DAY, source: "github", metric: "end_to_end", minSamples: 1 })
          expect(p.reduce((n, r) => n + r.count, 0)).toBe(3)
        }))

      test("typed failures end the reservation and set the target's status", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 3)
          yield* s.recordObservations([obs("github", "e", null), obs("github", "u", null), obs("github", "k", null)], T0)
          const e = yield* claimed(s, d.id, 0, T0)
          const u = yield* claimed(s, d.id, 1, T0)
          const k = yield* claimed(s, d.id, 2, T0)
          yield* finish(s, e, T0 + MIN, "scan_error")
          yield* finish(s, u, T0 + MIN, "unsupported")
          yield* s.submitResult({ ...auth(k, T0 + MIN), outcome: "killed_at_deadline", finalPhase: "cleanup", body: "{}" })
          expect((yield* s.getTarget("github", "e")).status).toBe("failed")
          expect((yield* s.getTarget("github", "u")).status).toBe("unresolved")
          expect((yield* s.getTarget("github", "k")).status).toBe("failed")
          expect(yield* s.getAssignment(k.reservationId)).toMatchObject({ state: "failed", outcome: "killed_at_deadline", finalPhase: "cleanup" })
          expect((yield* s.listAssignments({ state: "failed", limit: 10 })).map((x) => x.reservationId)).toEqual([k, u, e].map((x) => x.reservationId))
        }))

      test("refuses a result after the result-upload deadline, and a superseded attempt", (s) =>
        Effect.gen(function* () {
          const a = yield* active(s)
          expect(yield* failure(finish(s, a, a.uploadDeadline + 1))).toMatchObject({ _tag: "ReservationRefused", reason: "upload_deadline_passed" })
          expect(yield* failure(finish(s, a, a.expiresAt))).toMatchObject({ reason: "expired" })
          const [gone] = yield* s.expireDue({ now: a.expiresAt, maxAttempts: 3, limit: 10 })
          expect(gone.reservationId).toBe(a.reservationId)
          const next = yield* claimed(s, a.deviceId, 0, a.expiresAt + 1)
          expect(next.fence).toBe(a.fence + 2)
          expect(yield* failure(finish(s, a, a.expiresAt + 2))).toMatchObject({ reason: "expired" })
          expect(yield* failure(finish(s, { ...next, fence: a.fence }, a.expiresAt + 2))).toMatchObject({ reason: "stale_fence" })
          expect(yield* finish(s, next, a.expiresAt + 3)).toMatchObject({ reservationId: next.reservationId })
        }))

      test("release gives the target back to the queue with a new fence", (s) =>
        Effect.gen(function* () {
          const a = yield* active(s)
          const r = yield* s.release(auth(a, T0 + MIN))
          expect(r).toMatchObject({ state: "released", endedAt: T0 + MIN })
          expect(yield* s.getTarget("github", "o/r")).toMatchObject({ status: "pending", fence: a.fence + 1 })
          expect(yield* failure(s.release(auth(a, T0 + 2 * MIN)))).toMatchObject({ reason: "not_active" })
          expect(yield* failure(finish(s, a, T0 + 2 * MIN))).toMatchObject({ reason: "not_active" })
          const b = yield* claimed(s, a.deviceId, 0, T0 + 3 * MIN)
          expect(b).toMatchObject({ identity: "o/r", fence: a.fence + 2 })
        }))

      test("Assignment expires", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 3)
          yield* s.recordObservations([obs("github", "with-progress", null), obs("github", "silent", null)], T0)
          const a = yield* claimed(s, d.id, 0, T0)
          const b = yield* claimed(s, d.id, 1, T0 + 1)
          yield* s.appendProgress(auth(a, T0 + 5 * MIN), [ev(1, "assigned", T0), ev(2, "scanning", T0 + MIN)])
          expect(yield* s.expireDue({ now: a.expiresAt - 1, maxAttempts: 3, limit: 10 })).toEqual([])
          const expired = yield* s.expireDue({ now: b.expiresAt, maxAttempts: 3, limit: 10 })
          expect(expired.map((x) => x.reservationId)).toEqual([a.reservationId, b.reservationId])
          expect(expired[0].expiry).toEqual({ lastPhase: "scanning", lastProgressAt: T0 + 5 * MIN, expiredAt: b.expiresAt })
          expect(expired[1].expiry).toEqual({ lastPhase: null, lastProgressAt: null, expiredAt: b.expiresAt })
          expect(yield* s.getAssignment(a.reservationId)).toEqual(expired[0])
          expect(yield* s.getTarget("github", "with-progress")).toMatchObject({ status: "pending", fence: a.fence + 1 })
          expect(yield* s.expireDue({ now: b.expiresAt + 1, maxAttempts: 3, limit: 10 })).toEqual([])
        }))

      test("expiry fails a target out of attempts, oldest expiry first, within the sweep limit", (s) =>
        Effect.gen(function* () {
          const d = yield* addDevice(s, 3)
          yield* s.recordObservations([obs("github", "x", null), obs("github", "y", null), obs("github", "z", null)], T0)
          const x = yield* claimed(s, d.id, 0, T0 + 2)
          const y = yield* claimed(s, d.id, 1, T0 + 1)
          const z = yield* claimed(s, d.id, 2, T0)
          const first = yield* s.expireDue({ now: T0 + 2 * DAY, maxAttempts: 1, limit: 2 })
          expect(first.map((a) => a.identity)).toEqual([z.identity, y.identity])
          expect((yield* s.getTarget("github", "z")).status).toBe("failed")
          const rest = yield* s.expireDue({ now: T0 + 2 * DAY, maxAttempts: 2, limit: 2 })
          expect(rest.map((a) => a.reservationId)).toEqual([x.reservationId])
          expect((yield* s.getTarget("github", "x")).status).toBe("pending")
        }))
    })

    describe("durations, percentiles, configuration, devices and reads", () => {
      const d = (source: Source.Source, metric: Percentile.Metric, outcome: Assignment.Outcome, ms: number, at: number): Assignment.Duration => ({ source, metric, outcome, ms, at })
      // The port's promise: exact counts and labels, values within Percentile.accuracy of the
      // exact percentile_cont over the same durations (plus Percentile.floorMs absolute).
      const near = (got: number, want: number) => Math.abs(got - want) <= Percentile.accuracy * Math.abs(want) * (1 + 1e-9) + Percentile.floorMs
      const expectNear = (row: Store.PercentileRow, values: ReadonlyArray<number>, minSamples: number) => {
        const exact = Percentile.summarize(values, minSamples)
        expect(row.count, JSON.stringify(values)).toBe(exact.count)
        for (const q of ["p50", "p95", "p99"] as const) {
          const g = row[q], e = exact[q]
          if (g.status === "ok" && e.status === "ok") expect(near(g.value, e.value), `${q} ${g.value} vs exact ${e.value} of ${JSON.stringify(values)}`).toBe(true)
          else expect(g).toEqual(e)
        }
      }

      test("Administrator reviews DockerHub latency", (s) =>
        Effect.gen(function* () {
          const samples: Array<Assignment.Duration> = []
          for (const metric of Percentile.metrics) for (let i = 1; i <= 25; i++) samples.push(d("dockerhub", metric, "clean", i * 1000 + metric.length * 7.5, T0 + i))
          samples.push(d("github", "scanning", "clean", 1, T0), d("dockerhub", "scanning", "findings", 5, T0))
          yield* s.recordDurations(samples)
          const rows = yield* s.percentiles({ from: T0, to: T0 + DAY, source: "dockerhub", outcome: "clean", minSamples: 20 })
          expect(rows.map((r) => r.metric)).toEqual([...Percentile.metrics].sort((a, b) => a.localeCompare(b)))
          for (const r of rows) {
            expect(r).toMatchObject({ source: "dockerhub", outcome: "clean", count: 25 })
            expectNear(r, samples.filter((x) => x.source === "dockerhub" && x.outcome === "clean" && x.metric === r.metric).map((x) => x.ms), 20)
            expect(r.p95.status).toBe("ok")
          }
          const all = yield* s.percentiles({ from: T0, to: T0 + DAY, minSamples: 1 })
          expect(all.map((r) => `${r.source}/${r.metric}/${r.outcome}`)).toContain("dockerhub/scanning/findings")
          expect(all.map((r) => r.source)).toContain("github")
        }))

      test("percentiles are within Percentile.accuracy (under 1%) of core's exact Percentile.summarize for any set of samples", (s) =>
        Effect.gen(function* () {
          const sets = fc.sample(fc.array(fc.double({ min: 0, max: 1e7, noNaN: true, noDefaultInfinity: true }), { minLength: 1, maxLength: 80 }), 6)
          const metrics = Percentile.metrics
          const samples = sets.flatMap((values, i) => values.map((ms, k) => d("huggingface", metrics[i % metrics.length], i < 5 ? "clean" : "findings", ms, T0 + k)))
          yield* s.recordDurations(samples)
          const rows = yield* s.percentiles({ from: T0, to: T0 + DAY, minSamples: 1 })
          for (const r of rows) {
            const mine = samples.filter((x) => x.metric === r.metric && x.outcome === r.outcome).map((x) => x.ms)
            expect(r.source).toBe("huggingface")
            expectNear(r, mine, 1)
          }
        }))

      test("records 30,000 duration observations in one call", (s) =>
        Effect.gen(function* () {
          yield* s.recordDurations(Array.from({ length: 30_000 }, (_, i) => d("github", "end_to_end", "clean", i + 0.25, T0 + (i % 1000))))
          const [row] = yield* s.percentiles({ from: T0, to: T0 + DAY, minSamples: 1 })
          expect(row.count).toBe(30_000)
          expectNear(row, Array.from({ length: 30_000 }, (_, i) => i + 0.25), 1)
        }), 60_000)

      test("Insufficient samples exist", (s) =>
        Effect.gen(function* () {
          yield* s.recordDurations([1, 2, 3].map((i) => d("gitlab", "upload", "clean", i * 10, T0)))
          const [row] = yield* s.percentiles({ from: T0, to: T0 + 1, metric: "upload", minSamples: 20 })
          expect(row).toEqual({
            source: "gitlab",
            metric: "upload",
            outcome: "clean",
            count: 3,
            p50: { status: "insufficient", count: 3, required: 20 },
            p95: { status: "insufficient", count: 3, required: 20 },
            p99: { status: "insufficient", count: 3, required: 20 }
          })
        }))

      test("the percentile window includes its start and excludes its end", (s) =>
        Effect.gen(function* () {
          yield* s.recordDurations([d("github", "end_to_end", "clean", 10, T0 - 1), d("github", "end_to_end", "clean", 20, T0), d("github", "end_to_end", "clean", 30, T0 + 9), d("github", "end_to_end", "clean", 40, T0 + 10)])
          const [row] = yield* s.percentiles({ from: T0, to: T0 + 10, minSamples: 1 })
          expectNear(row, [20, 30], 1)
          expect(yield* s.percentiles({ from: T0, to: T0 + 10, outcome: "findings", minSamples: 1 })).toEqual([])
        }))

      test("odd inputs read alike on every store: a NaN or infinite duration is stored as Percentile.storedMs gives it, and a fractional, infinite or NaN window bound as Percentile.windowOf reads it", (s) =>
        Effect.gen(function* () {
          yield* s.recordDurations([
            d("github", "end_to_end", "clean", Number.NaN, T0 + 1),
            d("github", "end_to_end", "clean", 1, T0 + 2),
            d("github", "end_to_end", "clean", Number.NEGATIVE_INFINITY, T0 + 3),
            d("github", "end_to_end", "clean", Number.POSITIVE_INFINITY, T0 + 4)
          ])
          const [all] = yield* s.percentiles({ from: T0, to: T0 + 10, minSamples: 1 })
          // 0, 0, 1 and the ceiling: the median between 0 and 1
          expect(all.p50).toMatchObject({ status: "ok" })
          expect(all.p50.status === "ok" && all.p50.value).toBeLessThanOrEqual(0.5 * (1 + Percentile.accuracy) + Percentile.floorMs)
          expect(all.p99.status === "ok" && all.p99.value).toBeGreaterThan(1e299)
          // [1.5, 3.5) holds the durations ended at 2 and 3
          const [some] = yield* s.percentiles({ from: T0 + 1.5, to: T0 + 3.5, minSamples: 1 })
          expect(some.p50).toMatchObject({ status: "ok" })
          expect((yield* s.percentiles({ from: Number.NEGATIVE_INFINITY, to: Number.POSITIVE_INFINITY, minSamples: 1 })).map((r) => r.p50)).toEqual([all.p50])
          expect(yield* s.percentiles({ from: Number.NaN, to: T0 + 10, minSamples: 1 })).toEqual([])
          expect(some.count).toBe(2)
          expect(all.count).toBe(4)
        }))

      test("a duration's end instant is stored as Percentile.storedDurations gives it on every store: a fractional one rounded up, and a batch holding one that is no instant (NaN, infinite, past the date range) refused whole", (s) =>
        Effect.gen(function* () {
          for (const at of [Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, Percentile.maxInstant + 1]) {
            const refused = yield* Effect.flip(s.recordDurations([d("gitlab", "end_to_end", "clean", 5, T0 + 1), d("gitlab", "end_to_end", "clean", 5, at)]))
            expect(refused).toMatchObject({ _tag: "StoreError", reason: "invalid" })
          }
          expect(yield* s.percentiles({ from: Number.NEGATIVE_INFINITY, to: Number.POSITIVE_INFINITY, source: "gitlab", minSamples: 1 })).toEqual([])
          yield* s.recordDurations([d("gitlab", "end_to_end", "clean", 7, T0 + 1.25), d("gitlab", "end_to_end", "clean", 7, -Percentile.maxInstant)])
          // 1.25 is kept as 2: in [2, 3), not in [1, 2)
          expect(yield* s.percentiles({ from: T0 + 1, to: T0 + 2, source: "gitlab", minSamples: 1 })).toEqual([])
          expect((yield* s.percentiles({ from: T0 + 2, to: T0 + 3, source: "gitlab", minSamples: 1 })).map((r) => r.count)).toEqual([1])
          expect((yield* s.percentiles({ from: Number.NEGATIVE_INFINITY, to: T0, source: "gitlab", minSamples: 1 })).map((r) => r.count)).toEqual([1])
        }))

      test("percentiles of any window [from, to) are within Percentile.accuracy of the exact percentiles of the durations inside it, across hour and day edges", (s) =>
        Effect.gen(function* () {
          // Durations over three days, so windows cut days and hours at arbitrary points.
          const rnd = fc.sample(fc.tuple(fc.integer({ min: 0, max: 3 * DAY - 1 }), fc.integer({ min: 0, max: 200_000 }), fc.integer({ min: 0, max: 2 })), { numRuns: 600, seed: 8 })
          const metrics = ["scanning", "upload", "cleanup"] as const
          const samples = rnd.map(([at, ms, k]) => d("gitlab", metrics[k], "clean", ms / 7, T0 + at))
          yield* s.recordDurations(samples.slice(0, 300))
          yield* s.recordDurations(samples.slice(300))
          const windows = fc.sample(fc.tuple(fc.integer({ min: -HOUR, max: 3 * DAY + HOUR }), fc.integer({ min: 1, max: 3 * DAY })), { numRuns: 25, seed: 9 })
          windows.push([0, DAY], [HOUR, 2 * DAY - HOUR], [30 * 60_000, DAY + HOUR + 1], [-DAY, 4 * DAY], [DAY - 1, DAY + 1])
          for (const [start, len] of windows) {
            const from = T0 + start, to = from + len
            const rows = yield* s.percentiles({ from, to, minSamples: 1 })
            const inside = samples.filter((x) => x.at >= from && x.at < to)
            expect(rows.map((r) => r.metric)).toEqual([...new Set(inside.map((x) => x.metric))].sort((a, b) => a.localeCompare(b)))
            for (const r of rows) expectNear(r, inside.filter((x) => x.metric === r.metric).map((x) => x.ms), 1)
          }
        }), 60_000)

      test("Invalid deadline policy is previewed", (s) =>
        Effect.gen(function* () {
          const bad = { ...config, assignments: { ...config.assignments, globalTtlSeconds: 60 } }
          expect(Either.isLeft(Config.preview(bad))).toBe(true)
          // preview never writes
          expect(yield* s.activeConfig()).toBeNull()
          const v1 = yield* s.applyConfig(config, "alice", T0)
          const tuned = { ...config, metrics: { minSamples: 5 } }
          const v2 = yield* s.applyConfig(tuned, "bob", T0 + 1)
          expect([v1.version, v2.version]).toEqual([1, 2])
          expect(yield* s.activeConfig()).toEqual({ version: 2, document: tuned, appliedBy: "bob", appliedAt: T0 + 1 })
        }))

      test("devices are found by token hash until revoked", (s) =>
        Effect.gen(function* () {
          const a = yield* addDevice(s, 3, "alpha")
          const b = yield* addDevice(s, 1, "beta")
          expect(a).toEqual({ id: a.id, name: "alpha", slots: 3, createdAt: T0, revokedAt: null, containment: null, reportedAt: null })
          expect(b.id).toBeGreaterThan(a.id)
          expect(yield* s.deviceByTokenHash("hash-alpha")).toEqual(a)
          expect(yield* s.deviceByTokenHash("nope")).toBeNull()
          yield* s.revokeDevice(a.id, T0 + 5)
          yield* s.revokeDevice(a.id, T0 + 9)
          expect(yield* s.deviceByTokenHash("hash-alpha")).toBeNull()
          expect(yield* failure(s.revokeDevice(9999, T0))).toMatchObject({ _tag: "NotFound", entity: "device" })
        }))

      test("a device's report is kept on it; a revoked or unknown device cannot report", (s) =>
        Effect.gen(function* () {
          const a = yield* addDevice(s, 2, "reporter")
          const reported = yield* s.reportDevice(a.id, { containment: "pid-namespace", now: T0 + 3 })
          expect(reported).toEqual({ ...a, containment: "pid-namespace", reportedAt: T0 + 3 })
          expect(yield* s.deviceByTokenHash("hash-reporter")).toEqual(reported)
          yield* s.revokeDevice(a.id, T0 + 4)
          expect(yield* failure(s.reportDevice(a.id, { containment: "freeze-kill", now: T0 + 5 }))).toMatchObject({ _tag: "NotFound", entity: "device" })
          expect(yield* failure(s.reportDevice(9999, { containment: "freeze-kill", now: T0 + 5 }))).toMatchObject({ _tag: "NotFound", entity: "device" })
        }))

      test("the store is one fleet: one UUID, the same on every read", (s) =>
        Effect.gen(function* () {
          const f = yield* s.fleet()
          expect(f.id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
          expect(yield* s.fleet()).toEqual(f)
        }))

      test("reads: missing rows, listing order and filters, counts, cycles", (s) =>
        Effect.gen(function* () {
          expect(yield* failure(s.getTarget("github", "missing"))).toMatchObject({ _tag: "NotFound", entity: "target", key: "github:missing" })
          expect(yield* failure(s.getAssignment(77))).toMatchObject({ _tag: "NotFound", entity: "assignment", key: "77" })
          expect(yield* s.timeline(77)).toEqual([])
          const d1 = yield* addDevice(s, 2, "one")
          const d2 = yield* addDevice(s, 2, "two")
          yield* s.recordObservations(["a", "b", "c"].map((i) => obs("huggingface", i, null)), T0)
          const a = yield* claimed(s, d1.id, 0, T0)
          const b = yield* claimed(s, d2.id, 0, T0)
          const c = yield* claimed(s, d1.id, 1, T0)
          yield* s.release(auth(b, T0 + 1))
          expect((yield* s.listAssignments({ limit: 10 })).map((x) => x.reservationId)).toEqual([c, b, a].map((x) => x.reservationId))
          expect((yield* s.listAssignments({ limit: 1 })).map((x) => x.reservationId)).toEqual([c.reservationId])
          expect((yield* s.listAssignments({ state: "active", deviceId: d1.id, limit: 10 })).map((x) => x.reservationId)).toEqual([c, a].map((x) => x.reservationId))
          expect(yield* s.countTargets()).toEqual([
            { source: "huggingface", status: "in_progress", count: 2 },
            { source: "huggingface", status: "pending", count: 1 }
          ])
          const base = { startedAt: T0, endedAt: T0, pages: 1, results: 0, malformed: 0, queuedNewCount: 0, queuedUpdatedCount: 0, deferredCount: 0, stopReason: "end_of_listing" as const }
          const c1 = yield* s.recordCycle({ ...base, source: "gitlab", error: null })
          const c2 = yield* s.recordCycle({ ...base, source: "github", stopReason: "error", error: "HTTP 502 from the listing" })
          expect(yield* s.listCycles({ limit: 10 })).toEqual([c2, c1])
          expect(yield* s.listCycles({ source: "gitlab", limit: 10 })).toEqual([c1])
        }))

      test("aggregates: assignments by state, outcome and last phase; cycle totals per source", (s) =>
        Effect.gen(function* () {
          expect(yield* s.countAssignments()).toEqual([])
          expect(yield* s.cycleTotals()).toEqual([])
          const d = yield* addDevice(s, 4, "agg")
          yield* s.recordObservations(["a", "b", "c", "d"].map((i) => obs("gitlab", i, null)), T0)
          const a = yield* claimed(s, d.id, 0, T0)
          const b = yield* claimed(s, d.id, 1, T0)
          const c = yield* claimed(s, d.id, 2, T0)
          yield* claimed(s, d.id, 3, T0)
          yield* s.appendProgress(auth(a, T0 + 1), [{ seq: 1, kind: "phase", phase: "assigned", at: T0 }, { seq: 2, kind: "phase", phase: "scanning", at: T0 + 1 }])
          yield* s.submitResult({ ...auth(b, T0 + 2), outcome: "killed_at_deadline", finalPhase: "scanning", body: "{}" })
          yield* s.release(auth(c, T0 + 3))
          expect(yield* s.countAssignments()).toEqual([
            { state: "active", source: "gitlab", outcome: null, lastPhase: null, count: 1 },
            { state: "active", source: "gitlab", outcome: null, lastPhase: "scanning", count: 1 },
            { state: "failed", source: "gitlab", outcome: "killed_at_deadline", lastPhase: null, count: 1 },
            { state: "released", source: "gitlab", outcome: null, lastPhase: null, count: 1 }
          ])
          const base = { startedAt: T0, endedAt: T0, pages: 1, results: 0, malformed: 0, deferredCount: 0, stopReason: "end_of_listing" as const, error: null }
          yield* s.recordCycle({ ...base, source: "gitlab", queuedNewCount: 4, queuedUpdatedCount: 0 })
          yield* s.recordCycle({ ...base, source: "gitlab", queuedNewCount: 1, queuedUpdatedCount: 2 })
          yield* s.recordCycle({ ...base, source: "github", queuedNewCount: 0, queuedUpdatedCount: 3 })
          expect(yield* s.cycleTotals()).toEqual([
            { source: "github", cycles: 1, queuedNewCount: 0, queuedUpdatedCount: 3 },
            { source: "gitlab", cycles: 2, queuedNewCount: 5, queuedUpdatedCount: 2 }
          ])
        }))
    })

    if (capabilities.concurrency) {
      describe("real concurrency", () => {
        test("32 racing configuration applies each store their own version, numbered 1 to 32 without a gap", (s) =>
          Effect.gen(function* () {
            const applied = yield* Effect.all(
              Array.from({ length: 32 }, (_, i) => s.applyConfig(Config.defaults, `admin-${i}`, T0 + i)),
              { concurrency: "unbounded" }
            )
            expect(applied.map((v) => v.version).sort((a, b) => a - b)).toEqual(Array.from({ length: 32 }, (_, i) => i + 1))
            expect((yield* s.activeConfig())?.version).toBe(32)
          }))
        test("durations recorded and percentiles read on many connections at once are all counted, once", (s) =>
          Effect.gen(function* () {
            const d = (i: number, k: number): Assignment.Duration => ({ source: "gitlab", metric: "scanning", outcome: "clean", ms: 100 + ((i * 7 + k) % 50), at: T0 + (i % 5) * 20 * MIN + k })
            const batches = Array.from({ length: 16 }, (_, i) => Array.from({ length: 25 }, (_, k) => d(i, k)))
            // writers race each other and readers that fold and read the counts meanwhile
            yield* Effect.all(
              [...batches.map((b) => s.recordDurations(b)), ...batches.map(() => s.percentiles({ from: T0, to: T0 + DAY, minSamples: 1 }))],
              { concurrency: "unbounded" }
            )
            const [row] = yield* s.percentiles({ from: T0, to: T0 + DAY, minSamples: 1 })
            expect(row.count).toBe(400)
            const exact = Percentile.summarize(batches.flat().map((x) => x.ms), 1)
            for (const q of ["p50", "p95", "p99"] as const) {
              const g = row[q], e = exact[q]
              expect(g.status === "ok" && e.status === "ok" && Math.abs(g.value - e.value) <= Percentile.accuracy * e.value).toBe(true)
            }
          }))

        test("16 racing callers of single claims and single results are each answered once, with their own fenced reservation and receipt", (s) =>
          Effect.gen(function* () {
            const devices = yield* Effect.forEach(Array.from({ length: 8 }, (_, i) => i), (i) => addDevice(s, 2, `merge-${i}`))
            yield* s.recordObservations(Array.from({ length: 20 }, (_, i) => obs("github", `merge/${i}`, T0 - i)), T0)
            const callers = devices.flatMap((d) => [0, 1].map((slot) => ({ deviceId: d.id, slot })))
            const claimed = yield* Effect.all(callers.map((c, i) => s.claim({ ...c, now: T0 + i, config })), { concurrency: "unbounded" })
            // every caller got a reservation of its own slot, on a distinct target, issued at its own time
            expect(claimed.map((a) => a && [a.deviceId, a.slot, a.issuedAt])).toEqual(callers.map((c, i) => [c.deviceId, c.slot, T0 + i]))
            expect(new Set(claimed.map((a) => a!.targetId)).size).toBe(16)
            for (const a of claimed) expect((yield* s.getTarget("github", a!.identity))).toMatchObject({ status: "in_progress", fence: a!.fence })
            // each result raced by a copy of itself, and by a write under a stale fence
            const input = (a: Assignment.Assignment, fence: number) => ({ deviceId: a.deviceId, reservationId: a.reservationId, fence, now: T0 + MIN, outcome: "clean" as const, finalPhase: null, body: "{}" })
            const answers = yield* Effect.all(
              claimed.flatMap((a) => [input(a!, a!.fence), input(a!, a!.fence), input(a!, a!.fence - 1)]).map((i) => Effect.either(s.submitResult(i))),
              { concurrency: "unbounded" }
            )
            claimed.forEach((a, i) => {
              const receipt = { receiptId: `rc-${a!.reservationId}-${a!.fence}`, reservationId: a!.reservationId, outcome: "clean", acceptedAt: T0 + MIN }
              expect(answers[3 * i]).toEqual(Either.right(receipt))
              expect(answers[3 * i + 1]).toEqual(Either.right(receipt))
              expect(Either.isLeft(answers[3 * i + 2]) && answers[3 * i + 2]).toMatchObject({ left: { _tag: "ReservationRefused", reason: "stale_fence" } })
            })
            expect((yield* s.countTargets()).filter((c) => c.status === "completed")).toEqual([{ source: "github", status: "completed", count: 16 }])
            const [e2e] = yield* s.percentiles({ from: T0, to: T0 + DAY, source: "github", metric: "end_to_end", minSamples: 1 })
            expect(e2e.count).toBe(16)
          }))

        test("16 racing callers of results with their slots' next claims are each answered once: every result accepted once, every slot claimed once, by a fenced reservation", (s) =>
          Effect.gen(function* () {
            const devices = yield* Effect.forEach(Array.from({ length: 8 }, (_, i) => i), (i) => addDevice(s, 2, `pair-${i}`))
            yield* s.recordObservations(Array.from({ length: 40 }, (_, i) => obs("github", `pair/${i}`, T0 - i)), T0)
            const first = yield* s.claimMany({ deviceId: devices[0].id, slots: [0, 1], now: T0, config })
            const rest = yield* Effect.forEach(devices.slice(1), (d) => s.claimMany({ deviceId: d.id, slots: [0, 1], now: T0, config }))
            const claimed = [...first, ...rest.flat()]
            expect(claimed).toHaveLength(16)
            const input = (a: Assignment.Assignment, fence: number) => ({ deviceId: a.deviceId, reservationId: a.reservationId, fence, now: T0 + MIN, outcome: "clean" as const, finalPhase: null, body: "{}" })
            // each call raced by a copy of itself and by one under a stale fence
            const answers = yield* Effect.all(
              claimed.flatMap((a) => [input(a, a.fence), input(a, a.fence), input(a, a.fence - 1)]).map((i) => Effect.either(s.submitResultAndClaim(i, { slot: claimed.find((a) => a.reservationId === i.reservationId)!.slot, config }))),
              { concurrency: "unbounded" }
            )
            const nexts: Array<Assignment.Assignment> = []
            claimed.forEach((a, i) => {
              const receipt = { receiptId: `rc-${a.reservationId}-${a.fence}`, reservationId: a.reservationId, outcome: "clean", acceptedAt: T0 + MIN }
              const copies = [answers[3 * i], answers[3 * i + 1]].map((x) => (Either.isRight(x) ? x.right : undefined))
              for (const c of copies) expect(c?.receipt).toEqual(receipt)
              // one copy claimed the slot; the other found it held by that claim
              const took = copies.filter((c) => c?.next !== null)
              expect(took).toHaveLength(1)
              const next = took[0]!.next!
              expect(next).toMatchObject({ deviceId: a.deviceId, slot: a.slot, state: "active", issuedAt: T0 + MIN })
              expect(copies.find((c) => c?.next === null)?.claimRefused).toMatchObject({ reason: "slot_busy", holder: { reservationId: next.reservationId, fence: next.fence } })
              expect(Either.isLeft(answers[3 * i + 2]) && answers[3 * i + 2]).toMatchObject({ left: { _tag: "ReservationRefused", reason: "stale_fence" } })
              nexts.push(next)
            })
            expect(new Set([...claimed, ...nexts].map((a) => a.targetId)).size).toBe(32)
            for (const n of nexts) expect(yield* s.getTarget("github", n.identity)).toMatchObject({ status: "in_progress", fence: n.fence })
            expect((yield* s.listAssignments({ state: "active", limit: 100 })).map((a) => a.reservationId).sort((x, y) => x - y)).toEqual(nexts.map((n) => n.reservationId).sort((x, y) => x - y))
            expect([...(yield* s.countTargets())].sort((x, y) => x.status.localeCompare(y.status))).toEqual([
              { source: "github", status: "completed", count: 16 },
              { source: "github", status: "in_progress", count: 16 },
              { source: "github", status: "pending", count: 8 }
            ])
            const [e2e] = yield* s.percentiles({ from: T0, to: T0 + DAY, source: "github", metric: "end_to_end", minSamples: 1 })
            expect(e2e.count).toBe(16)
          }))

        test("racing claims on many connections never take a target twice nor fill a device past its slots", (s) =>
          Effect.gen(function* () {
            const devices = yield* Effect.forEach([0, 1, 2, 3, 4, 5, 6, 7], (i) => addDevice(s, 3, `racer-${i}`))
            yield* s.recordObservations(Array.from({ length: 40 }, (_, i) => obs("github", `race/${i}`, T0 - i)), T0)
            // every slot of every device is asked for four times at once, and slot 3 (out of range) too
            const attempts = devices.flatMap((d) => [0, 1, 2, 3].flatMap((slot) => [0, 1, 2, 3].map(() => ({ deviceId: d.id, slot }))))
            const results = yield* Effect.all(
              attempts.map((r) => Effect.either(s.claim({ ...r, now: T0, config }))),
              { concurrency: "unbounded" }
            )
            const won = results.flatMap((r) => (Either.isRight(r) && r.right !== null ? [r.right] : []))
            expect(won).toHaveLength(24)
            expect(new Set(won.map((a) => a.identity)).size).toBe(24)
            for (const d of devices) expect(won.filter((a) => a.deviceId === d.id).length).toBeLessThanOrEqual(3)
            const lost = results.flatMap((r) => (Either.isLeft(r) ? [r.left.reason] : []))
            expect(new Set(lost)).toEqual(new Set(["slot_busy", "capacity"]))
            const active = yield* s.listAssignments({ state: "active", limit: 100 })
            expect(active).toHaveLength(24)
            expect(yield* s.countTargets()).toEqual([
              { source: "github", status: "in_progress", count: 24 },
              { source: "github", status: "pending", count: 16 }
            ])
          }))

        test("one device of N slots raced by many claimers never holds more than N reservations nor two on one slot", (s) =>
          Effect.gen(function* () {
            const N = 6
            const d = yield* addDevice(s, N, "crowded")
            yield* s.recordObservations(Array.from({ length: 200 }, (_, i) => obs("github", `crowd/${i}`, null)), T0)
            const check = Effect.gen(function* () {
              const active = yield* s.listAssignments({ state: "active", deviceId: d.id, limit: 1000 })
              expect(active.length).toBeLessThanOrEqual(N)
              expect(new Set(active.map((a) => a.slot)).size).toBe(active.length)
              for (const a of active) expect(a.slot).toBeGreaterThanOrEqual(0)
              for (const a of active) expect(a.slot).toBeLessThan(N)
              const inProgress = (yield* s.countTargets()).find((c) => c.status === "in_progress")?.count ?? 0
              expect(inProgress).toBe(active.length)
              return active
            })
            // Each round: single claims of every slot (and one past the last) and batch claims of overlapping
            // slot lists race each other and the completion of the previous round's winners.
            let winners: ReadonlyArray<Assignment.Assignment> = []
            for (let round = 0; round < 4; round++) {
              const singles = Array.from({ length: 3 * (N + 1) }, (_, i) => s.claim({ deviceId: d.id, slot: i % (N + 1), now: T0 + round, config }))
              const batches = [[0, 1, 2], [3, 4, 5], [5, 4], [1, 3, 5], [0, 2, 4], [2, 3]].map((slots) =>
                s.claimMany({ deviceId: d.id, slots, now: T0 + round, config })
              )
              // the previous winners are live and within their deadlines: their results are accepted
              const finishes = winners.map((a) => Effect.as(Effect.orDie(finish(s, a, T0 + round)), []))
              const results = yield* Effect.all(
                [...singles.map((e) => Effect.map(e, (a) => (a ? [a] : []))), ...batches, ...finishes].map((e): Effect.Effect<Either.Either<ReadonlyArray<Assignment.Assignment>, unknown>> => Effect.either(e)),
                { concurrency: "unbounded" }
              )
              for (const r of results) if (Either.isLeft(r)) expect(["slot_busy", "capacity"]).toContain((r.left as { reason?: string }).reason)
              const won = results.flatMap((r) => (Either.isRight(r) ? r.right : []))
              expect(new Set(won.map((a) => a.identity)).size).toBe(won.length)
              const active = yield* check
              expect(won.map((a) => a.reservationId).sort((x, y) => x - y)).toEqual(active.map((a) => a.reservationId).sort((x, y) => x - y))
              winners = active
            }
            yield* Effect.forEach(winners, (a) => finish(s, a, T0 + 10))
            expect(yield* check).toEqual([])
          }))

        test("racing claims under a per-source cap never exceed it", (s) =>
          Effect.gen(function* () {
            const devices = yield* Effect.forEach([0, 1, 2, 3, 4, 5, 6, 7], (i) => addDevice(s, 2, `capped-${i}`))
            yield* s.recordObservations(Array.from({ length: 30 }, (_, i) => obs(i % 2 === 0 ? "github" : "gitlab", `cap/${i}`, null)), T0)
            const results = yield* Effect.all(
              devices.flatMap((d) => [0, 1].map((slot) => Effect.either(s.claim({ deviceId: d.id, slot, now: T0, config, sourceCap: 3 })))),
              { concurrency: "unbounded" }
            )
            const won = results.flatMap((r) => (Either.isRight(r) && r.right !== null ? [r.right] : []))
            expect(won.filter((a) => a.source === "github")).toHaveLength(3)
            expect(won.filter((a) => a.source === "gitlab")).toHaveLength(3)
          }))

        test("racing discovery batches insert each identity once and keep the newest observation", (s) =>
          Effect.gen(function* () {
            const ids = Array.from({ length: 300 }, (_, i) => `disc/${i}`)
            // each racer sees the same identities in its own order, with its own timestamps
            const batches = Array.from({ length: 8 }, (_, r) =>
              ids.map((_, i) => ids[(i * (2 * r + 1) + r * 37) % ids.length]).map((identity, i) => obs("github", identity, T0 + r * 1000 + (i % 7)))
            )
            const results = yield* Effect.all(
              batches.map((b, r) => s.recordObservations(b, T0 + r)),
              { concurrency: "unbounded" }
            )
            const inserted = results.flatMap((r) => r.inserted)
            expect(inserted.length).toBe(ids.length)
            expect(new Set(inserted).size).toBe(ids.length)
            expect(results.reduce((n, r) => n + r.known, 0)).toBe(8 * ids.length - ids.length)
            for (const identity of ids.slice(0, 20)) {
              const newest = Math.max(...batches.flatMap((b) => b.filter((o) => o.identity === identity).map((o) => o.remoteAt ?? 0)))
              expect((yield* s.getTarget("github", identity)).observedRemoteAt).toBe(newest)
            }
          }))

        test("racing promotions promote each covered revision at most once", (s) =>
          Effect.gen(function* () {
            const d = yield* addDevice(s, 20)
            yield* s.recordObservations(Array.from({ length: 20 }, (_, i) => obs("gitlab", `p/${i}`, T0 - DAY)), T0)
            const as = yield* Effect.forEach(Array.from({ length: 20 }, (_, i) => i), (slot) => claimed(s, d.id, slot, T0 + slot))
            yield* Effect.forEach(as, (a) => finish(s, a, T0 + 30 * MIN))
            yield* s.recordObservations(Array.from({ length: 20 }, (_, i) => obs("gitlab", `p/${i}`, T0 + 2 * HOUR)), T0 + 3 * HOUR)
            const cycles = yield* Effect.all(
              Array.from({ length: 12 }, () => s.promote("gitlab", rule(4, HOUR), T0 + 2 * DAY)),
              { concurrency: "unbounded" }
            )
            const promoted = cycles.flatMap((c) => c.promoted)
            expect(promoted.length).toBe(20)
            expect(new Set(promoted).size).toBe(20)
            for (const c of cycles) expect(c.promoted.length).toBeLessThanOrEqual(4)
            const ts = yield* Effect.forEach(promoted, (i) => s.getTarget("gitlab", i))
            for (const t of ts) expect(t).toMatchObject({ status: "pending", fence: 2 })
          }))

        test("interleaved progress retries never duplicate a timeline event", (s) =>
          Effect.gen(function* () {
            const d = yield* addDevice(s, 4)
            yield* s.recordObservations([0, 1, 2, 3].map((i) => obs("github", `prog/${i}`, null)), T0)
            const as = yield* Effect.forEach([0, 1, 2, 3], (slot) => claimed(s, d.id, slot, T0))
            const run = normalRun(T0)
            // each retry resends everything up to its own position, as an outbox does after a lost response
            const sends = as.flatMap((a) => run.flatMap((_, i) => [0, 1].map((k) => ({ a, events: run.slice(0, i + 1), now: T0 + i * 1000 + k }))))
            const results = yield* Effect.all(
              sends.map((x) => Effect.either(s.appendProgress(auth(x.a, x.now), x.events))),
              { concurrency: 16 }
            )
            // a batch may lose a race only as a gap (a later batch arrived first), never as a conflict
            for (const r of results) if (Either.isLeft(r)) expect(r.left).toMatchObject({ reason: "sequence_gap" })
            for (const a of as) {
              yield* s.appendProgress(auth(a, T0 + HOUR), run)
              const tl = yield* s.timeline(a.reservationId)
              expect(tl.map((e) => e.seq)).toEqual(run.map((e) => e.seq))
              const firstAcceptance = new Map<number, number>()
              for (const r of results)
                if (Either.isRight(r) && r.right.assignment.reservationId === a.reservationId)
                  for (const acc of r.right.results) {
                    const prior = firstAcceptance.get(acc.seq)
                    if (prior !== undefined) expect(acc.acceptedAt).toBe(prior)
                    firstAcceptance.set(acc.seq, acc.acceptedAt)
                  }
              for (const e of tl) expect(firstAcceptance.get(e.seq) ?? e.acceptedAt).toBe(e.acceptedAt)
            }
          }))

        test("racing copies of one batch store each sequence once, and every copy answers its first acceptance time", (s) =>
          Effect.gen(function* () {
            const d = yield* addDevice(s, 3)
            yield* s.recordObservations([0, 1, 2].map((i) => obs("github", `copies/${i}`, null)), T0)
            const as = yield* Effect.forEach([0, 1, 2], (slot) => claimed(s, d.id, slot, T0))
            const run = normalRun(T0)
            // the second wave starts with three events of the first, as a resend after a lost response does
            for (const [w, events] of [run.slice(0, 6), run.slice(3)].entries()) {
              const copies = as.flatMap((a) => Array.from({ length: 12 }, (_, k) => ({ a, now: T0 + w * MIN + k })))
              const answers = yield* Effect.all(copies.map((x) => s.appendProgress(auth(x.a, x.now), events)), { concurrency: "unbounded" })
              for (const a of as) {
                const mine = answers.filter((r) => r.assignment.reservationId === a.reservationId)
                const tl = yield* s.timeline(a.reservationId)
                for (const e of events) {
                  const stored = tl.find((x) => x.seq === e.seq)!
                  const acks = mine.map((r) => r.results.find((x) => x.seq === e.seq)!)
                  expect(acks.every((x) => x.acceptedAt === stored.acceptedAt)).toBe(true)
                  expect(acks.filter((x) => x.status === "accepted")).toHaveLength(w === 1 && e.seq <= 6 ? 0 : 1)
                }
              }
            }
            for (const a of as) expect((yield* s.timeline(a.reservationId)).map((e) => e.seq)).toEqual(run.map((e) => e.seq))
          }))

        test("racing result batches, single results and expiry sweeps settle each reservation once", (s) =>
          Effect.gen(function* () {
            const d = yield* addDevice(s, 24)
            yield* s.recordObservations(Array.from({ length: 24 }, (_, i) => obs("github", `batch/${i}`, null)), T0)
            const as = yield* s.claimMany({ deviceId: d.id, slots: Array.from({ length: 24 }, (_, i) => i), now: T0, config })
            const input = (a: Assignment.Assignment, k: number): Store.ResultInput => ({ ...auth(a, T0 + MIN + k), outcome: "clean", finalPhase: null, body: "{}" })
            // overlapping batches in opposite orders, single results, and sweeps past every expiry
            const batches = [as.slice(0, 16), [...as.slice(8)].reverse(), as.filter((_, i) => i % 3 === 0)].map((xs, k) => s.submitResults(xs.map((a) => input(a, k))))
            const singles = as.filter((_, i) => i % 5 === 0).map((a) => Effect.either(s.submitResult(input(a, 9))))
            const sweeps = [0, 1].map(() => s.expireDue({ now: T0 + 2 * DAY, maxAttempts: 3, limit: 100 }))
            const [answers, single, swept] = yield* Effect.all(
              [Effect.all(batches, { concurrency: "unbounded" }), Effect.all(singles, { concurrency: "unbounded" }), Effect.all(sweeps, { concurrency: "unbounded" })],
              { concurrency: "unbounded" }
            )
            const expired = new Set(swept.flat().map((a) => a.reservationId))
            for (const a of as) {
              const receipts = [...answers.flat(), ...single].flatMap((r) => (Either.isRight(r) && r.right.reservationId === a.reservationId ? [r.right] : []))
              const stored = yield* s.getAssignment(a.reservationId)
              if (expired.has(a.reservationId)) {
                expect(stored.state).toBe("expired")
                expect(receipts).toEqual([])
              } else {
                expect(stored.state).toBe("completed")
                // every accepted answer for a reservation is the one receipt it was given
                expect(new Set(receipts.map((r) => JSON.stringify(r))).size).toBe(1)
                expect(stored.endedAt).toBe(receipts[0].acceptedAt)
              }
            }
            const ends = (yield* s.percentiles({ from: 0, to: Number.MAX_SAFE_INTEGER, metric: "end_to_end", minSamples: 1 })).reduce((n, r) => n + r.count, 0)
            expect(ends).toBe(as.length - expired.size)
          }))

        test("racing result retries and expiry sweeps settle each reservation once", (s) =>
          Effect.gen(function* () {
            const d = yield* addDevice(s, 10)
            yield* s.recordObservations(Array.from({ length: 10 }, (_, i) => obs("github", `settle/${i}`, null)), T0)
            const as = yield* Effect.forEach(Array.from({ length: 10 }, (_, i) => i), (slot) => claimed(s, d.id, slot, T0))
            const [finishing, expiring] = [as.slice(0, 5), as.slice(5)]
            const receipts = yield* Effect.all(
              finishing.flatMap((a) => [0, 1, 2].map((k) => finish(s, a, T0 + MIN + k))),
              { concurrency: "unbounded" }
            )
            for (const a of finishing) expect(new Set(receipts.filter((r) => r.reservationId === a.reservationId).map((r) => r.acceptedAt)).size).toBe(1)
            const sweeps = yield* Effect.all(
              Array.from({ length: 8 }, () => s.expireDue({ now: T0 + 2 * DAY, maxAttempts: 3, limit: 100 })),
              { concurrency: "unbounded" }
            )
            const expired = sweeps.flat().map((a) => a.reservationId).sort((x, y) => x - y)
            expect(expired).toEqual(expiring.map((a) => a.reservationId).sort((x, y) => x - y))
            for (const a of expiring) expect(yield* s.getTarget("github", a.identity)).toMatchObject({ status: "pending", fence: a.fence + 1 })
          }))
      })
    } else {
      it.skip(`real concurrency: ${name} declares { concurrency: false }, so the racing tests do not run against it`, () => {})
    }

    const runs = capabilities.modelRuns ?? 12
    describe("model-based", () => {
      if (runs > 0)
        it.live(
          "random command sequences leave the same observable state as core's model after every step",
          () => Model.check(makeStore, () => Store.Store.of(MemoryStore.make()), runs),
          120_000
        )
      else it.skip(`model-based comparison: ${name} runs it with modelRuns: 0, so it does not run`, () => {})
    })
  })


/** The conformance suite of the findings port, beside the Store's. */
export { findingConformance, type FindingCapabilities, type MakeStores } from "./FindingConformance.js"
