import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Either, Exit, Layer, Scope } from "effect"
import * as fc from "effect/FastCheck"
import { type Assignment, Config, MemoryStore, Operations, PhaseModel, Priority, Retry, type Source, Store } from "@scanfleet/core"

/** What an operations backend can be asked to prove beyond the common behaviour. */
export interface OperationsCapabilities {
  /** Several connections really run at once (Postgres): the racing tests run. */
  readonly concurrency: boolean
  /** Random command sequences compared with core's model (default 8 runs). */
  readonly modelRuns?: number
}

/** Builds a fresh, empty Store with its operator port for one test. */
export type MakeOperations = () => Layer.Layer<Store.Store | Operations.Operations, unknown>

type S = Store.StoreShape
type O = Operations.OperationsShape

const T0 = Date.UTC(2025, 0, 1)
const MIN = 60_000
const HOUR = 60 * MIN
const DAY = 24 * HOUR
const config = Config.defaults
const backoff = { initialSeconds: 60, maxSeconds: 240, maxRedrives: 2 }
const who = (now: number, why = "checking"): Operations.Actor => ({ who: "admin", why, now })
const obs = (source: Source.Source, identity: string, remoteAt: number | null) => ({ source, identity, remoteAt })
const auth = (a: Assignment.Assignment, now: number): Store.Authority => ({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now })
const claimed = (s: S, deviceId: number, slot: number, now: number) =>
  Effect.flatMap(s.claim({ deviceId, slot, now, config }), (a) => (a === null ? Effect.dieMessage("expected a pending target to claim") : Effect.succeed(a)))
const finish = (s: S, a: Assignment.Assignment, now: number, outcome: Assignment.Outcome = "clean") =>
  s.submitResult({ ...auth(a, now), outcome, finalPhase: "awaiting_receipt", body: "{}" })
const failure = <A, E>(self: Effect.Effect<A, E>) => Effect.flip(self) as Effect.Effect<E & { readonly _tag: string; readonly reason?: string }, A>

/**
 * The conformance suite of the operator port (with the Store it shares its tables with):
 * retries per revision and the failure backoff, target listing and inspection, requeue,
 * cancellation, paused sources, device filters and revocation, the audit log, leases, races
 * when the backend has real concurrency, and a model-based comparison with core's model.
 *
 * @example
 * operationsConformance("my store", () => MyStore.layer(settings), { concurrency: true })
 */
export const operationsConformance = (name: string, make: MakeOperations, capabilities: OperationsCapabilities) =>
  describe(`Operations conformance: ${name}`, () => {
    const test = <A, E>(title: string, body: (s: S, o: O) => Effect.Effect<A, E>, timeout?: number) =>
      it.live(title, () => Effect.flatMap(Effect.all([Store.Store, Operations.Operations]), ([s, o]) => body(s, o)).pipe(Effect.provide(make())), timeout)

    describe("retries per revision", () => {
      test("a promotion starts a fresh retry budget: a target rescanned twice for updates still gets every attempt at its third scan", (s) =>
        Effect.gen(function* () {
          const d = yield* s.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
          yield* s.recordObservations([obs("github", "o/r", T0 - DAY)], T0)
          let now = T0
          for (let scan = 1; scan <= 2; scan++) {
            yield* Effect.flatMap(claimed(s, d.id, 0, now), (a) => finish(s, a, now + MIN))
            now += 2 * DAY
            yield* s.recordObservations([obs("github", "o/r", now - HOUR)], now)
            expect((yield* s.promote("github", { budget: 10, cooldownMs: DAY }, now)).promoted).toEqual(["o/r"])
          }
          // the third scan: maxAttempts - 1 expiries re-queue it, the last one fails it
          for (let attempt = 1; attempt <= config.expiry.maxAttempts; attempt++) {
            const a = yield* claimed(s, d.id, 0, now)
            now = a.expiresAt
            yield* s.expireDue({ now, maxAttempts: config.expiry.maxAttempts, limit: 10 })
            expect((yield* s.getTarget("github", "o/r")).status).toBe(attempt < config.expiry.maxAttempts ? "pending" : "failed")
          }
        }))

      test("a failed target is redriven after its backoff, at most maxRedrives times at one revision, each with a fresh expiry budget", (s, o) =>
        Effect.gen(function* () {
          const d = yield* s.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
          yield* s.recordObservations([obs("gitlab", "g/p", T0 - DAY)], T0)
          let now = T0
          for (let n = 0; n < backoff.maxRedrives; n++) {
            const a = yield* claimed(s, d.id, 0, now)
            const endedAt = now + MIN
            yield* finish(s, a, endedAt, "scan_error")
            const due = endedAt + Retry.delayMs(backoff, n)
            expect(yield* o.redriveDue("gitlab", backoff, due - 1, 10)).toEqual({ redriven: [], planned: 1 })
            expect((yield* s.getTarget("gitlab", "g/p")).status).toBe("failed")
            expect(yield* o.redriveDue("gitlab", backoff, due, 10)).toEqual({ redriven: [{ identity: "g/p", reason: "backoff" }], planned: 0 })
            expect(yield* s.getTarget("gitlab", "g/p")).toMatchObject({ status: "pending", attempts: 0 })
            now = due
          }
          const a = yield* claimed(s, d.id, 0, now)
          yield* finish(s, a, now + MIN, "unsupported")
          expect((yield* s.getTarget("gitlab", "g/p")).status).toBe("unresolved")
          expect(yield* o.redriveDue("gitlab", backoff, now + 365 * DAY, 10)).toEqual({ redriven: [], planned: 1 })
          const [t] = (yield* o.listTargets({ source: "gitlab", limit: 10 })).targets
          expect(t.redrive).toMatchObject({ redrives: backoff.maxRedrives, retryAt: null })
          // a newer revision redrives it at once, with a fresh count
          yield* s.recordObservations([obs("gitlab", "g/p", T0)], now + 2 * MIN)
          expect(yield* o.redriveDue("gitlab", backoff, now + 2 * MIN, 10)).toEqual({ redriven: [{ identity: "g/p", reason: "newer_revision" }], planned: 0 })
          const b = yield* claimed(s, d.id, 0, now + 3 * MIN)
          expect(b.coveredRemoteAt).toBe(T0)
          yield* finish(s, b, now + 4 * MIN, "scan_error")
          yield* o.redriveDue("gitlab", backoff, now + 4 * MIN, 10)
          const [u] = (yield* o.listTargets({ source: "gitlab", limit: 10 })).targets
          expect(u.redrive.retryAt).toBe(now + 4 * MIN + Retry.delayMs(backoff, 0))
        }))

      test("an expired-out target is redriven by backoff too, due from its last expiry; redrives take the limit in due order", (s, o) =>
        Effect.gen(function* () {
          const d = yield* s.addDevice({ name: "d", slots: 2, tokenHash: "h", now: T0 })
          yield* s.recordObservations([obs("dockerhub", "x@sha256:1", null), obs("dockerhub", "y@sha256:2", null)], T0)
          const a = yield* claimed(s, d.id, 0, T0)
          const b = yield* claimed(s, d.id, 1, T0 + MIN)
          yield* s.expireDue({ now: b.expiresAt, maxAttempts: 1, limit: 10 })
          expect((yield* s.countTargets()).find((c) => c.status === "failed")?.count).toBe(2)
          expect((yield* o.redriveDue("dockerhub", backoff, b.expiresAt, 0)).planned).toBe(2)
          const r = yield* o.redriveDue("dockerhub", backoff, b.expiresAt + Retry.delayMs(backoff, 0), 1)
          expect(r.redriven).toEqual([{ identity: a.identity, reason: "backoff" }])
        }))
    })

    describe("targets", () => {
      test("listing filters by source, status, identity prefix and change time, and pages by id with a cursor", (s, o) =>
        Effect.gen(function* () {
          yield* s.recordObservations([obs("github", "acme/a", null), obs("github", "acme/b", null), obs("github", "other/c", null), obs("gitlab", "acme/d", null)], T0)
          yield* s.recordObservations([obs("github", "acme/e", null)], T0 + HOUR)
          const ids = (p: Operations.TargetPage) => p.targets.map((t) => t.identity)
          const p1 = yield* o.listTargets({ source: "github", identityPrefix: "acme/", limit: 2 })
          expect(ids(p1)).toEqual(["acme/a", "acme/b"])
          expect(p1.next).toBe(p1.targets[1].id)
          const p2 = yield* o.listTargets({ source: "github", identityPrefix: "acme/", limit: 2, after: p1.next! })
          expect(ids(p2)).toEqual(["acme/e"])
          expect(p2.next).toBeNull()
          expect(ids(yield* o.listTargets({ changedSince: T0 + 1, limit: 10 }))).toEqual(["acme/e"])
          expect(ids(yield* o.listTargets({ status: "completed", limit: 10 }))).toEqual([])
          expect(ids(yield* o.listTargets({ identityPrefix: "%", limit: 10 }))).toEqual([])
          expect(ids(yield* o.listTargets({ identityPrefix: "acme/_", limit: 10 }))).toEqual([])
          expect((yield* o.listTargets({ limit: 0 })).targets).toEqual([])
        }))

      test("inspection shows every lifecycle field and each assignment with its timeline, expiry evidence and cancellation", (s, o) =>
        Effect.gen(function* () {
          const d = yield* s.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
          yield* s.recordObservations([obs("github", "o/r", T0 - DAY)], T0)
          const a = yield* claimed(s, d.id, 0, T0)
          yield* s.appendProgress(auth(a, T0 + MIN), [{ seq: 1, kind: "phase", phase: "assigned", at: T0 + MIN }])
          yield* s.expireDue({ now: a.expiresAt, maxAttempts: 3, limit: 10 })
          const b = yield* claimed(s, d.id, 0, a.expiresAt)
          yield* o.cancel(b.reservationId, who(a.expiresAt + MIN, "stuck"))
          const i = yield* o.inspectTarget("github", "o/r", 10, Operations.apiTimeline)
          expect(i.target).toMatchObject({ identity: "o/r", status: "pending", attempts: 2, fence: 4, coveredRemoteAt: T0 - DAY, observedRemoteAt: T0 - DAY, lastScanStartedAt: a.expiresAt })
          expect(i.target.changedAt).toBe(a.expiresAt + MIN)
          expect(i.assignments.map((x) => [x.assignment.reservationId, x.assignment.state])).toEqual([
            [b.reservationId, "released"],
            [a.reservationId, "expired"]
          ])
          expect(i.assignments[0].cancellation).toEqual({ reservationId: b.reservationId, at: a.expiresAt + MIN, who: "admin", why: "stuck" })
          expect(i.assignments[1].assignment.expiry).toEqual({ lastPhase: "assigned", lastProgressAt: T0 + MIN, expiredAt: a.expiresAt })
          expect(i.assignments[1].timeline.map((e) => [e.seq, e.phase, e.acceptedAt])).toEqual([[1, "assigned", T0 + MIN]])
          expect(i.assignments.map((x) => x.omittedEvents)).toEqual([0, 0])
          expect((yield* o.inspectTarget("github", "o/r", 1, Operations.apiTimeline)).assignments).toHaveLength(1)
          expect(yield* failure(o.inspectTarget("github", "nope", 10, Operations.apiTimeline))).toMatchObject({ _tag: "NotFound", entity: "target" })
        }))

      test("an inspection reads each timeline bounded: every phase event and the newest `recent` events, with or without details, and counts what it leaves out", (s, o) =>
        Effect.gen(function* () {
          const d = yield* s.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
          yield* s.recordObservations([obs("github", "o/fat", T0 - DAY)], T0)
          // the longest legal timeline: recoveries up to the last sequence one may take, then every
          // later phase and a terminal, each event with the longest detail
          const a = yield* claimed(s, d.id, 0, T0)
          const detail = "x".repeat(1000)
          const rest = PhaseModel.phases.slice(1, PhaseModel.phases.length - PhaseModel.terminal.length)
          const events: Array<PhaseModel.Event> = [
            { seq: 1, kind: "phase", phase: "assigned", at: T0, detail },
            ...Array.from({ length: PhaseModel.lastRecoverySeq - 1 }, (_, k): PhaseModel.Event => ({ seq: k + 2, kind: "recovered", phase: "assigned", at: T0 + k + 1, detail })),
            ...[...rest, "completed" as const].map((phase, k): PhaseModel.Event => ({ seq: PhaseModel.lastRecoverySeq + 1 + k, kind: "phase", phase, at: T0 + 2000 + k, detail }))
          ]
          expect(events[events.length - 1].seq).toBe(PhaseModel.maxSeq)
          for (let k = 0; k < events.length; k += 100) yield* s.appendProgress(auth(a, T0 + MIN), events.slice(k, k + 100))
          yield* s.expireDue({ now: a.expiresAt, maxAttempts: 3, limit: 10 })
          const b = yield* claimed(s, d.id, 0, a.expiresAt)
          yield* s.appendProgress(auth(b, a.expiresAt + MIN), [
            { seq: 1, kind: "phase", phase: "assigned", at: a.expiresAt, detail: "b" },
            { seq: 2, kind: "recovered", phase: "assigned", at: a.expiresAt + 1 }
          ])
          const seqs = (x: Operations.AssignmentDetail) => x.timeline.map((e) => e.seq)
          const phaseSeqs = events.filter((e) => e.kind === "phase").map((e) => e.seq)
          const newest = events.slice(-Operations.apiTimeline.recent).map((e) => e.seq)

          const api = yield* o.inspectTarget("github", "o/fat", 10, Operations.apiTimeline)
          expect(api.assignments.map((x) => x.assignment.reservationId)).toEqual([b.reservationId, a.reservationId])
          expect(seqs(api.assignments[0])).toEqual([1, 2])
          expect(api.assignments[0].omittedEvents).toBe(0)
          expect(api.assignments[0].timeline[0]).toMatchObject({ detail: "b", acceptedAt: a.expiresAt + MIN })
          const fat = api.assignments[1]
          expect(seqs(fat)).toEqual([...new Set([...phaseSeqs, ...newest])].sort((x, y) => x - y))
          expect(fat.timeline.length).toBeLessThanOrEqual(PhaseModel.phases.length - PhaseModel.terminal.length + 1 + Operations.apiTimeline.recent)
          expect(fat.omittedEvents).toBe(PhaseModel.maxSeq - fat.timeline.length)
          expect(fat.timeline.every((e) => e.detail === detail)).toBe(true)

          // phase events only, without details: what a page that draws phase spans reads
          const spans = yield* o.inspectTarget("github", "o/fat", 10, { recent: 0, details: false })
          expect(seqs(spans.assignments[1])).toEqual(phaseSeqs)
          expect(spans.assignments[1].omittedEvents).toBe(PhaseModel.lastRecoverySeq - 1)
          expect(spans.assignments[1].timeline.map(({ acceptedAt: _, ...e }) => e)).toEqual(events.filter((e) => e.kind === "phase").map(({ detail: _, ...e }) => e))
          expect(seqs(spans.assignments[0])).toEqual([1])
          expect(spans.assignments[0].omittedEvents).toBe(1)

          // the whole timeline stays where it always was
          expect((yield* s.timeline(a.reservationId)).map((e) => e.seq)).toEqual(events.map((e) => e.seq))
        }), 60_000)

      test("requeue puts a finished target back to pending with fresh budgets, refuses one in flight or pending, and is audited", (s, o) =>
        Effect.gen(function* () {
          const d = yield* s.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
          yield* s.recordObservations([obs("github", "o/r", null)], T0)
          expect(yield* failure(o.requeue("github", "o/r", who(T0)))).toMatchObject({ _tag: "OperationRefused", reason: "already_pending" })
          const a = yield* claimed(s, d.id, 0, T0)
          expect(yield* failure(o.requeue("github", "o/r", who(T0)))).toMatchObject({ _tag: "OperationRefused", reason: "in_progress" })
          yield* finish(s, a, T0 + MIN, "scan_error")
          yield* o.redriveDue("github", backoff, T0 + MIN, 0)
          const t = yield* o.requeue("github", "o/r", who(T0 + 2 * MIN, "scanner fixed"))
          expect(t).toMatchObject({ status: "pending", attempts: 0, fence: a.fence + 1, redrive: Retry.initialState })
          expect(yield* s.getTarget("github", "o/r")).toMatchObject({ status: "pending", fence: a.fence + 1, attempts: 0 })
          expect(yield* failure(o.requeue("github", "missing", who(T0)))).toMatchObject({ _tag: "NotFound" })
          expect(yield* o.schemaVersion()).toSatisfy((v: number | null) => v === null || v >= 8)
          const [e] = yield* o.listAudit({ limit: 10 })
          expect(e).toMatchObject({ at: T0 + 2 * MIN, who: "admin", action: "requeue", subject: "github:o/r", why: "scanner fixed" })
          expect(JSON.parse(e.detail)).toEqual({ from: "failed" })
        }))
    })

    describe("claim priority", () => {
      const identityOf = (a: Assignment.Assignment | null) => a?.identity ?? null
      test("claims take a higher priority ahead of id order, the rest keep id order, and every change is audited with who, why, from and to", (s, o) =>
        Effect.gen(function* () {
          const d = yield* s.addDevice({ name: "d", slots: 4, tokenHash: "h", now: T0 })
          yield* s.recordObservations(["a", "b", "c", "d"].map((i) => obs("github", i, null)), T0)
          const set = yield* o.setPriority("github", "c", 5, { who: "alice", why: "customer escalation", now: T0 + MIN })
          expect(set).toMatchObject({ identity: "c", priority: 5, status: "pending", fence: 0 })
          yield* o.setPriority("github", "a", -1, who(T0 + MIN))
          const order: Array<string | null> = []
          for (let slot = 0; slot < 4; slot++) order.push(identityOf(yield* s.claim({ deviceId: d.id, slot, now: T0 + 2 * MIN, config })))
          expect(order).toEqual(["c", "b", "d", "a"])
          expect((yield* s.getTarget("github", "c")).priority).toBe(5)
          const [entry] = yield* o.listAudit({ limit: 2 }).pipe(Effect.map((es) => es.filter((e) => e.subject === "github:c")))
          expect(entry).toMatchObject({ action: "set_priority", who: "alice", why: "customer escalation", at: T0 + MIN, subject: "github:c" })
          expect(JSON.parse(entry.detail)).toEqual({ from: 0, to: 5 })
        }))

      test("every claim path honours it: a batch fills its slots in claim order, a filtered and a capped claim take the prioritised target first", (s, o) =>
        Effect.gen(function* () {
          const d = yield* s.addDevice({ name: "d", slots: 4, tokenHash: "h", now: T0 })
          yield* s.recordObservations([obs("github", "g1", null), obs("gitlab", "l1", null), obs("github", "g2", null), obs("gitlab", "l2", null)], T0)
          yield* s.recordObservations([obs("github", "g3", null), obs("gitlab", "l3", null)], T0)
          yield* o.setPriority("github", "g3", 1, who(T0))
          yield* o.setPriority("gitlab", "l3", 2, who(T0))
          const batch = yield* s.claimMany({ deviceId: d.id, slots: [2, 0], now: T0, config })
          expect(batch.map((a) => [a.slot, a.identity])).toEqual([[2, "l3"], [0, "g3"]])
          expect(identityOf(yield* s.claim({ deviceId: d.id, slot: 1, now: T0, config, sources: ["gitlab"] }))).toBe("l1")
          yield* o.setPriority("github", "g2", 100, who(T0))
          expect(identityOf(yield* s.claim({ deviceId: d.id, slot: 3, now: T0, config, sourceCap: 3 }))).toBe("g2")
        }))

      test("the shift is bounded: priority p moves a target by p × step ids, so at -1 it still goes before the target step ids newer (no starvation), at -2 not", (s, o) =>
        Effect.gen(function* () {
          const d = yield* s.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
          yield* s.recordObservations([obs("github", "old", null)], T0)
          yield* o.setPriority("github", "old", -1, who(T0))
          // step - 1 newer targets elsewhere, then two github targets: "edge" is exactly step ids newer than "old"
          const batch = [...Array.from({ length: Priority.step - 1 }, (_, i) => obs("gitlab", `n${i}`, null)), obs("github", "edge", null), obs("github", "after", null)]
          yield* s.recordObservations(batch, T0)
          const [old, edge] = yield* Effect.all([s.getTarget("github", "old"), s.getTarget("github", "edge")])
          expect(edge.id - old.id, "a fresh store numbers one batch consecutively").toBe(Priority.step)
          const first = yield* s.claim({ deviceId: d.id, slot: 0, now: T0, config, sources: ["github"] })
          expect(identityOf(first)).toBe("old")
          yield* s.release(auth(first!, T0))
          yield* o.setPriority("github", "old", -2, who(T0))
          const second = yield* s.claim({ deviceId: d.id, slot: 0, now: T0, config, sources: ["github"] })
          expect(identityOf(second)).toBe("edge")
        }), 60_000)

      test("a priority outside [-100, 100] or on an unknown target is refused and changes nothing; it is not an authority change", (s, o) =>
        Effect.gen(function* () {
          const d = yield* s.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
          yield* s.recordObservations([obs("github", "a", null)], T0)
          for (const p of [101, -101, 1.5]) expect(yield* failure(o.setPriority("github", "a", p, who(T0)))).toMatchObject({ _tag: "OperationRefused", reason: "invalid_priority" })
          expect(yield* failure(o.setPriority("github", "nope", 1, who(T0)))).toMatchObject({ _tag: "NotFound" })
          expect((yield* s.getTarget("github", "a")).priority).toBe(0)
          expect((yield* o.listAudit({ limit: 10 })).filter((e) => e.action === "set_priority")).toEqual([])
          const a = yield* claimed(s, d.id, 0, T0)
          const t = yield* o.setPriority("github", "a", 7, who(T0 + MIN))
          expect(t).toMatchObject({ status: "in_progress", fence: a.fence, priority: 7 })
          expect(yield* finish(s, a, T0 + 2 * MIN)).toMatchObject({ reservationId: a.reservationId })
          expect(yield* s.getTarget("github", "a")).toMatchObject({ status: "completed", priority: 7 })
        }))
    })

    describe("assignments and devices", () => {
      test("cancelling an active assignment fences it: the device's next write is refused, the target is pending again", (s, o) =>
        Effect.gen(function* () {
          const d = yield* s.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
          yield* s.recordObservations([obs("github", "o/r", null)], T0)
          const a = yield* claimed(s, d.id, 0, T0)
          const c = yield* o.cancel(a.reservationId, who(T0 + MIN, "runaway"))
          expect(c).toMatchObject({ reservationId: a.reservationId, state: "released", endedAt: T0 + MIN })
          expect(yield* failure(finish(s, a, T0 + 2 * MIN))).toMatchObject({ _tag: "ReservationRefused", reason: "not_active" })
          expect(yield* failure(s.appendProgress(auth(a, T0 + 2 * MIN), [{ seq: 1, kind: "phase", phase: "assigned", at: T0 }]))).toMatchObject({ reason: "not_active" })
          expect(yield* s.getTarget("github", "o/r")).toMatchObject({ status: "pending", fence: a.fence + 1 })
          expect(yield* o.cancellation(a.reservationId)).toEqual({ reservationId: a.reservationId, at: T0 + MIN, who: "admin", why: "runaway" })
          expect(yield* o.cancellation(a.reservationId + 100)).toBeNull()
          expect(yield* failure(o.cancel(a.reservationId, who(T0)))).toMatchObject({ _tag: "OperationRefused", reason: "not_active" })
          expect(yield* failure(o.cancel(9999, who(T0)))).toMatchObject({ _tag: "NotFound", entity: "assignment" })
          // the slot is free again
          expect((yield* claimed(s, d.id, 0, T0 + 3 * MIN)).targetId).toBe(a.targetId)
          expect((yield* o.listAudit({ limit: 10 })).map((e) => e.action)).toEqual(["cancel"])
        }))

      test("a device's last contact is its own requests (Operations.contactOf): its claim, progress, result and release move it; an operator's cancellation and the sweep's expiry do not", (s, o) =>
        Effect.gen(function* () {
          const d = yield* s.addDevice({ name: "quiet", slots: 2, tokenHash: "hq", now: T0 })
          yield* s.recordObservations([obs("github", "q1", null), obs("github", "q2", null), obs("github", "q3", null)], T0)
          const contact = () => Effect.map(o.listDevices(), (ds) => ds.find((x) => x.id === d.id)!.lastContactAt)
          const a = yield* claimed(s, d.id, 0, T0 + MIN)
          expect(yield* contact()).toBe(T0 + MIN)
          yield* o.cancel(a.reservationId, who(T0 + 2 * MIN, "stuck"))
          expect(yield* contact()).toBe(T0 + MIN)
          const b = yield* claimed(s, d.id, 0, T0 + 3 * MIN)
          yield* s.release(auth(b, T0 + 4 * MIN))
          expect(yield* contact()).toBe(T0 + 4 * MIN)
          const c = yield* claimed(s, d.id, 1, T0 + 5 * MIN)
          const swept = yield* s.expireDue({ now: c.expiresAt!, maxAttempts: 5, limit: 10 })
          expect(swept.map((x) => x.reservationId)).toContain(c.reservationId)
          expect(yield* contact()).toBe(T0 + 5 * MIN)
          const e = yield* claimed(s, d.id, 1, c.expiresAt! + MIN)
          yield* finish(s, e, c.expiresAt! + 2 * MIN)
          expect(yield* contact()).toBe(c.expiresAt! + 2 * MIN)
        }))

      test("devices are listed with their filter, last contact, containment level and active reservations; revocation ends those at once, fenced", (s, o) =>
        Effect.gen(function* () {
          const d1 = yield* s.addDevice({ name: "one", slots: 2, tokenHash: "h1", now: T0 })
          const d2 = yield* s.addDevice({ name: "two", slots: 1, tokenHash: "h2", now: T0 })
          yield* s.recordObservations([obs("github", "a", null), obs("github", "b", null), obs("gitlab", "c", null)], T0)
          const a = yield* claimed(s, d1.id, 0, T0 + MIN)
          const b = yield* claimed(s, d1.id, 1, T0 + 2 * MIN)
          yield* s.appendProgress(auth(b, T0 + 3 * MIN), [{ seq: 1, kind: "phase", phase: "assigned", at: T0 + 3 * MIN }])
          const f = yield* o.setDeviceSources(d2.id, ["gitlab"], who(T0))
          expect(f.sources).toEqual(["gitlab"])
          expect(yield* o.deviceFilters()).toEqual([{ deviceId: d2.id, sources: ["gitlab"] }])
          yield* s.reportDevice(d1.id, { containment: "pid-namespace", now: T0 + 2 * MIN })
          const list = yield* o.listDevices()
          expect(list.map((d) => [d.id, d.name, d.slots, d.sources, d.lastContactAt, d.containment, d.reportedAt, d.active.map((x) => x.reservationId)])).toEqual([
            [d1.id, "one", 2, null, T0 + 3 * MIN, "pid-namespace", T0 + 2 * MIN, [a.reservationId, b.reservationId]],
            [d2.id, "two", 1, ["gitlab"], null, null, null, []]
          ])
          const ended = yield* o.revokeDevice(d1.id, who(T0 + 4 * MIN, "lost laptop"))
          expect(ended.map((x) => [x.reservationId, x.state])).toEqual([
            [a.reservationId, "released"],
            [b.reservationId, "released"]
          ])
          expect(yield* failure(finish(s, b, T0 + 5 * MIN))).toMatchObject({ _tag: "ReservationRefused" })
          expect((yield* s.countTargets()).find((c) => c.source === "github")).toEqual({ source: "github", status: "pending", count: 2 })
          expect(yield* failure(s.claim({ deviceId: d1.id, slot: 0, now: T0 + 5 * MIN, config }))).toMatchObject({ reason: "unknown_device" })
          expect((yield* o.listDevices())[0].revokedAt).toBe(T0 + 4 * MIN)
          // the revocation is not the device's contact, and each reservation it ended says who ended it and why
          expect((yield* o.listDevices())[0].lastContactAt).toBe(T0 + 3 * MIN)
          expect(yield* o.cancellation(a.reservationId)).toEqual({ reservationId: a.reservationId, at: T0 + 4 * MIN, who: "admin", why: `device ${d1.id} revoked: lost laptop` })
          expect((yield* o.setDeviceSources(d2.id, null, who(T0))).sources).toBeNull()
          expect(yield* o.deviceFilters()).toEqual([])
          expect(yield* failure(o.revokeDevice(999, who(T0)))).toMatchObject({ _tag: "NotFound", entity: "device" })
          expect(yield* failure(o.setDeviceSources(999, null, who(T0)))).toMatchObject({ _tag: "NotFound", entity: "device" })
          expect((yield* o.listAudit({ limit: 10 })).map((e) => [e.action, e.subject])).toEqual([
            ["set_device_sources", `device:${d2.id}`],
            ["revoke_device", `device:${d1.id}`],
            ["set_device_sources", `device:${d2.id}`]
          ])
        }))

      test("sources pause and resume, with who, when and why while paused", (_s, o) =>
        Effect.gen(function* () {
          expect(yield* o.sourceControls()).toEqual(Operations.unpaused())
          expect(yield* o.setPaused("gitlab", true, who(T0, "rate limited"))).toEqual({ source: "gitlab", paused: true, pausedAt: T0, pausedBy: "admin", reason: "rate limited" })
          expect((yield* o.sourceControls()).filter((c) => c.paused).map((c) => c.source)).toEqual(["gitlab"])
          yield* o.setPaused("gitlab", false, who(T0 + 1))
          expect(yield* o.sourceControls()).toEqual(Operations.unpaused())
          expect(Operations.claimable(undefined, ["github", "gitlab"], [{ source: "gitlab", paused: true, pausedAt: 0, pausedBy: "a", reason: "r" }])).toEqual(["github"])
        }))
    })

    test("outcomes over time count each ended assignment once, in its bucket, every bucket listed", (s, o) =>
      Effect.gen(function* () {
        const d = yield* s.addDevice({ name: "d", slots: 4, tokenHash: "h", now: T0 })
        yield* s.recordObservations(["a", "b", "c", "e"].map((i) => obs("github", i, null)), T0)
        const as = yield* s.claimMany({ deviceId: d.id, slots: [0, 1, 2, 3], now: T0, config })
        yield* finish(s, as[0], T0 + MIN, "clean")
        yield* finish(s, as[1], T0 + 2 * MIN, "killed_at_deadline")
        yield* finish(s, as[2], T0 + 11 * MIN, "scan_error")
        yield* s.release(auth(as[3], T0 + 12 * MIN))
        const b = yield* o.outcomesOverTime(T0, T0 + 30 * MIN, 10 * MIN)
        expect(b).toEqual([
          { start: T0, completed: 1, timedOut: 1, failed: 0, expired: 0, released: 0 },
          { start: T0 + 10 * MIN, completed: 0, timedOut: 0, failed: 1, expired: 0, released: 1 },
          { start: T0 + 20 * MIN, completed: 0, timedOut: 0, failed: 0, expired: 0, released: 0 }
        ])
        expect(yield* o.outcomesOverTime(T0 + 10, T0, HOUR)).toEqual([])
      }))

    describe("audit and leases", () => {
      test("the audit log lists newest first and pages with `before`", (_s, o) =>
        Effect.gen(function* () {
          for (let i = 0; i < 5; i++) yield* o.audit("add_targets", `github:t${i}`, { n: i }, who(T0 + i, `batch ${i}`))
          const first = yield* o.listAudit({ limit: 2 })
          expect(first.map((e) => e.subject)).toEqual(["github:t4", "github:t3"])
          expect((yield* o.listAudit({ limit: 10, before: first[1].id })).map((e) => e.why)).toEqual(["batch 2", "batch 1", "batch 0"])
        }))

      test("a lease has one holder until it expires or is released; each new holder gets a greater token", (_s, o) =>
        Effect.gen(function* () {
          const a = yield* o.acquireLease("discovery:github", "a", 1000, T0)
          expect(a).toEqual({ name: "discovery:github", holder: "a", token: expect.any(Number), expiresAt: T0 + 1000 })
          expect(yield* o.acquireLease("discovery:github", "b", 1000, T0 + 999)).toBeNull()
          const renewed = yield* o.acquireLease("discovery:github", "a", 1000, T0 + 500)
          expect(renewed).toEqual({ ...a!, expiresAt: T0 + 1500 })
          const b = yield* o.acquireLease("discovery:github", "b", 1000, T0 + 1500)
          expect(b!.token).toBeGreaterThan(a!.token)
          expect(yield* o.acquireLease("discovery:gitlab", "a", 1000, T0 + 1500)).not.toBeNull()
          yield* o.releaseLease("discovery:github", "a", a!.token)
          expect(yield* o.acquireLease("discovery:github", "c", 1000, T0 + 1600)).toBeNull()
          yield* o.releaseLease("discovery:github", "b", b!.token)
          const c = yield* o.acquireLease("discovery:github", "c", 1000, T0 + 1600)
          expect(c!.token).toBeGreaterThan(b!.token)
        }))
    })

    const eligible = (s: S, n: number) =>
      Effect.gen(function* () {
        const d = yield* s.addDevice({ name: "d", slots: n, tokenHash: "h", now: T0 })
        yield* s.recordObservations(Array.from({ length: n }, (_, i) => obs("github", `p${i}`, T0 - DAY)), T0)
        const as = yield* s.claimMany({ deviceId: d.id, slots: Array.from({ length: n }, (_, i) => i), now: T0, config })
        yield* Effect.forEach(as, (a) => finish(s, a, T0 + MIN))
        yield* s.recordObservations(Array.from({ length: n }, (_, i) => obs("github", `p${i}`, T0)), T0 + HOUR)
      })

    test("a promotion under a lease runs only while the lease is held with its token", (s, o) =>
      Effect.gen(function* () {
        yield* eligible(s, 4)
        const now = T0 + 2 * DAY
        const a = (yield* o.acquireLease("discovery:github", "a", 1000, now))!
        expect((yield* o.promoteUnderLease(a, "github", { budget: 1, cooldownMs: DAY }, now))!.promoted).toHaveLength(1)
        const b = (yield* o.acquireLease("discovery:github", "b", 1000, now + 1000))!
        expect(yield* o.promoteUnderLease(a, "github", { budget: 1, cooldownMs: DAY }, now + 1000)).toBeNull()
        expect(yield* o.promoteUnderLease({ ...b, token: b.token + 1 }, "github", { budget: 1, cooldownMs: DAY }, now + 1000)).toBeNull()
        expect(yield* o.promoteUnderLease(b, "github", { budget: 1, cooldownMs: DAY }, now + 2000)).toBeNull()
        const b2 = (yield* o.acquireLease("discovery:github", "b", 1000, now + 1500))!
        expect((yield* o.promoteUnderLease(b2, "github", { budget: 5, cooldownMs: DAY }, now + 1500))!.promoted).toHaveLength(3)
        expect(yield* o.promoteUnderLease(b2, "dockerhub", { budget: 5, cooldownMs: DAY }, now + 1500)).toEqual({ promoted: [], deferred: 0 })
      }))

    if (capabilities.concurrency)
      describe("real concurrency", () => {
        test("instances racing for the lease and promoting under it spend one budget between them", (s, o) =>
          Effect.gen(function* () {
            yield* eligible(s, 10)
            const now = T0 + 2 * DAY
            const results = yield* Effect.all(
              Array.from({ length: 6 }, (_, i) =>
                Effect.flatMap(o.acquireLease("discovery:github", `i${i}`, 60_000, now), (l) =>
                  l === null ? Effect.succeed(0) : Effect.map(o.promoteUnderLease(l, "github", { budget: 3, cooldownMs: DAY }, now), (r) => r?.promoted.length ?? 0)
                )
              ),
              { concurrency: "unbounded" }
            )
            expect(results.reduce((a, b) => a + b, 0)).toBe(3)
          }))

        test("racing holders: exactly one takes a free lease", (_s, o) =>
          Effect.gen(function* () {
            const got = yield* Effect.all(
              Array.from({ length: 8 }, (_, i) => o.acquireLease("race", `h${i}`, 10_000, T0)),
              { concurrency: "unbounded" }
            )
            expect(got.filter((l) => l !== null)).toHaveLength(1)
          }))

        test("racing redrive passes redrive each failed target once, and a racing cancel and result leave one winner", (s, o) =>
          Effect.gen(function* () {
            const d = yield* s.addDevice({ name: "d", slots: 8, tokenHash: "h", now: T0 })
            yield* s.recordObservations(Array.from({ length: 8 }, (_, i) => obs("github", `r${i}`, null)), T0)
            const as = yield* s.claimMany({ deviceId: d.id, slots: [0, 1, 2, 3, 4, 5, 6, 7], now: T0, config })
            yield* Effect.forEach(as.slice(0, 6), (a) => finish(s, a, T0 + MIN, "scan_error"))
            yield* o.redriveDue("github", backoff, T0 + MIN, 0)
            const passes = yield* Effect.all(
              Array.from({ length: 4 }, () => o.redriveDue("github", backoff, T0 + HOUR, 100)),
              { concurrency: "unbounded" }
            )
            expect(passes.flatMap((p) => p.redriven.map((r) => r.identity)).sort()).toEqual(["r0", "r1", "r2", "r3", "r4", "r5"])
            const [cancel, result] = yield* Effect.all([Effect.either(o.cancel(as[6].reservationId, who(T0 + 2 * MIN))), Effect.either(finish(s, as[6], T0 + 2 * MIN))], {
              concurrency: "unbounded"
            })
            expect([Either.isRight(cancel), Either.isRight(result)].filter(Boolean)).toHaveLength(1)
            const t = yield* s.getTarget("github", "r6")
            expect(t.status).toBe(Either.isRight(cancel) ? "pending" : "completed")
          }))

        test("revocations racing claims of their devices' slots leave those devices no active reservation, and every claim after one is refused", (s, o) =>
          Effect.gen(function* () {
            const devices = yield* Effect.forEach([0, 1, 2, 3, 4, 5], (k) => s.addDevice({ name: `lost-${k}`, slots: 4, tokenHash: `h-lost-${k}`, now: T0 }))
            yield* s.recordObservations(Array.from({ length: 3000 }, (_, i) => obs("github", `rv${i}`, null)), T0)
            // Every slot claims, finishes and claims again (single claims and batches of two) until its
            // device's revocation has returned: a claim of a revoked device either committed before the
            // revocation (which ended it) or is refused; none is left active.
            const revoked = new Set<number>()
            let won = 0
            const acceptedAfter: Array<number> = []
            const refusals = new Set<string>()
            const loop = (deviceId: number, slot: number) =>
              Effect.gen(function* () {
                for (let i = 0; !revoked.has(deviceId) || i % 2 === 1; i++) {
                  const got = yield* Effect.either(
                    slot % 2 === 0 && i % 4 === 0
                      ? s.claimMany({ deviceId, slots: [slot, slot + 1], now: T0 + i, config })
                      : Effect.map(s.claim({ deviceId, slot, now: T0 + i, config }), (a) => (a === null ? [] : [a]))
                  )
                  if (Either.isLeft(got)) refusals.add(String((got.left as { reason?: string }).reason))
                  else
                    for (const a of got.right) {
                      won++
                      // a reservation alive once its device's revocation has returned would be accepted here
                      const after = revoked.has(deviceId)
                      const r = yield* Effect.either(finish(s, a, T0 + i + 1))
                      if (after && Either.isRight(r)) acceptedAfter.push(a.reservationId)
                    }
                }
              })
            const revoke = (deviceId: number, k: number) =>
              Effect.delay(Effect.tap(o.revokeDevice(deviceId, who(T0 + MIN, "stolen")), () => Effect.sync(() => revoked.add(deviceId))), `${100 + 40 * k} millis`)
            const ended = yield* Effect.all(
              [...devices.map((d, k) => revoke(d.id, k)), ...devices.flatMap((d) => [0, 1, 2, 3].map((slot) => Effect.as(loop(d.id, slot), [])))],
              { concurrency: "unbounded" }
            )
            expect(won).toBeGreaterThan(0)
            expect(acceptedAfter).toEqual([])
            for (const d of devices) expect(yield* s.listAssignments({ state: "active", deviceId: d.id, limit: 100 })).toEqual([])
            for (const a of ended.flat()) expect(a.state).toBe("released")
            for (const r of refusals) expect(["unknown_device", "slot_busy"]).toContain(r)
            expect(refusals.has("unknown_device")).toBe(true)
            expect(yield* failure(s.claim({ deviceId: devices[0].id, slot: 0, now: T0 + 2 * MIN, config }))).toMatchObject({ reason: "unknown_device" })
          }))
      })

    describe("model-based", () => {
      it.live(
        "random operator and worker command sequences leave the same targets, assignments and audit log as core's model",
        () => checkModel(make, capabilities.modelRuns ?? 8),
        120_000
      )
    })
  })

type Cmd =
  | { readonly _tag: "discover"; readonly identity: string; readonly remoteAt: number | null }
  | { readonly _tag: "claim"; readonly slot: number }
  | { readonly _tag: "finish"; readonly pick: number; readonly outcome: Assignment.Outcome }
  | { readonly _tag: "expire" }
  | { readonly _tag: "advance"; readonly ms: number }
  | { readonly _tag: "promote" }
  | { readonly _tag: "redrive"; readonly limit: number }
  | { readonly _tag: "requeue"; readonly identity: string }
  | { readonly _tag: "prioritise"; readonly identity: string; readonly priority: number }
  | { readonly _tag: "cancel"; readonly pick: number }
  | { readonly _tag: "revoke" }

const identities = ["a", "b", "c"]
const cmd: fc.Arbitrary<Cmd> = fc.oneof(
  fc.record({ _tag: fc.constant("discover" as const), identity: fc.constantFrom(...identities), remoteAt: fc.option(fc.integer({ min: 0, max: 40 }).map((h) => T0 + h * HOUR), { nil: null }) }),
  fc.record({ _tag: fc.constant("claim" as const), slot: fc.integer({ min: 0, max: 1 }) }),
  fc.record({ _tag: fc.constant("finish" as const), pick: fc.nat(), outcome: fc.constantFrom<Assignment.Outcome>("clean", "scan_error", "unsupported") }),
  fc.record({ _tag: fc.constant("expire" as const) }),
  fc.record({ _tag: fc.constant("advance" as const), ms: fc.constantFrom(MIN, HOUR, DAY) }),
  fc.record({ _tag: fc.constant("promote" as const) }),
  fc.record({ _tag: fc.constant("redrive" as const), limit: fc.integer({ min: 0, max: 2 }) }),
  fc.record({ _tag: fc.constant("requeue" as const), identity: fc.constantFrom(...identities) }),
  fc.record({ _tag: fc.constant("prioritise" as const), identity: fc.constantFrom(...identities), priority: fc.constantFrom(-100, -1, 0, 1, 2, 100, 101) }),
  fc.record({ _tag: fc.constant("cancel" as const), pick: fc.nat() }),
  fc.record({ _tag: fc.constant("revoke" as const) })
)

// What a step answered, in a form both backends give identically.
const outcome = <A>(self: Effect.Effect<A, unknown>) =>
  Effect.map(Effect.either(self), (e) =>
    Either.isLeft(e) ? { error: (e.left as { _tag?: string; reason?: string })._tag ?? "?", reason: (e.left as { reason?: string }).reason ?? null } : { ok: e.right }
  )

const checkModel = (make: MakeOperations, runs: number) =>
  Effect.promise(() =>
    fc.assert(
      fc.asyncProperty(fc.array(cmd, { minLength: 1, maxLength: 30 }), async (cmds) => {
        const scope = Effect.runSync(Scope.make())
        try {
          const ctx = await Effect.runPromise(Layer.buildWithScope(make(), scope))
          const real = { s: Context.get(ctx, Store.Store), o: Context.get(ctx, Operations.Operations) }
          const mctx = Effect.runSync(Effect.scoped(Layer.build(MemoryStore.layer)))
          const model = { s: Context.get(mctx, Store.Store), o: Context.get(mctx, Operations.Operations) }
          const device = await Promise.all([real, model].map((b) => Effect.runPromise(b.s.addDevice({ name: "d", slots: 2, tokenHash: "h", now: T0 }))))
          expect(device[0].id).toBe(device[1].id)
          let now = T0
          const step = (b: { s: S; o: O }, c: Cmd) =>
            Effect.gen(function* () {
              const active = () => b.s.listAssignments({ state: "active", limit: 100 })
              switch (c._tag) {
                case "discover":
                  return yield* outcome(b.s.recordObservations([obs("github", c.identity, c.remoteAt)], now))
                case "claim":
                  return yield* outcome(b.s.claim({ deviceId: device[0].id, slot: c.slot, now, config }))
                case "finish": {
                  const as = yield* active()
                  if (as.length === 0) return "none"
                  return yield* outcome(finish(b.s, as[c.pick % as.length], now, c.outcome))
                }
                case "expire":
                  return yield* outcome(b.s.expireDue({ now, maxAttempts: 2, limit: 10 }))
                case "advance":
                  now += c.ms
                  return "advanced"
                case "promote":
                  return yield* outcome(b.s.promote("github", { budget: 2, cooldownMs: HOUR }, now))
                case "redrive":
                  return yield* outcome(b.o.redriveDue("github", backoff, now, c.limit))
                case "requeue":
                  return yield* outcome(b.o.requeue("github", c.identity, who(now)))
                case "prioritise":
                  return yield* outcome(b.o.setPriority("github", c.identity, c.priority, who(now)))
                case "cancel": {
                  const as = yield* active()
                  if (as.length === 0) return "none"
                  return yield* outcome(b.o.cancel(as[c.pick % as.length].reservationId, who(now)))
                }
                case "revoke":
                  return yield* outcome(b.o.revokeDevice(device[0].id, who(now)))
              }
            })
          const observe = (b: { s: S; o: O }) =>
            Effect.all({
              targets: b.o.listTargets({ limit: 100 }),
              assignments: b.s.listAssignments({ limit: 100 }),
              audit: b.o.listAudit({ limit: 100 }),
              devices: b.o.listDevices()
            })
          for (const c of cmds) {
            const stepNow = now
            const got = await Effect.runPromise(step(real, c))
            now = stepNow
            const want = await Effect.runPromise(step(model, c))
            expect(got, JSON.stringify(c)).toEqual(want)
            expect(await Effect.runPromise(observe(real))).toEqual(await Effect.runPromise(observe(model)))
          }
        } finally {
          await Effect.runPromise(Scope.close(scope, Exit.void))
        }
      }),
      { numRuns: runs }
    )
  )
