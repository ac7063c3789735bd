import { describe, expect, it } from "@effect/vitest"
import { Either, FastCheck as fc } from "effect"
import { Assignment, Config, Deadline, PhaseModel, Target, WorkerWrite } from "@scanfleet/core"
import { T0, source } from "./fixtures/arbitraries.js"

// A reservation as a store holds it, built through core's own issuance.
const reservation = fc
  .record({
    reservationId: fc.integer({ min: 1, max: 5 }),
    deviceId: fc.integer({ min: 1, max: 3 }),
    fence: fc.integer({ min: 1, max: 4 }),
    source,
    state: fc.constantFrom(...Assignment.states),
    lastSeq: fc.nat({ max: 6 }),
    lastPhase: fc.option(fc.constantFrom(...PhaseModel.phases), { nil: null })
  })
  .map(({ reservationId, deviceId, fence, source, state, lastSeq, lastPhase }): Assignment.Assignment => {
    const t: Target.Target = { ...Target.admit(7, { source, identity: "a/b", remoteAt: null }, T0), status: "in_progress", fence }
    const { policy, deadlines } = Deadline.issueFor(Config.defaults, source, T0)
    return { ...Assignment.issued(t, { reservationId, deviceId, slot: 0 }, policy, deadlines), state, lastSeq, lastPhase: lastSeq === 0 ? null : lastPhase }
  })

const auth = fc.record({ reservationId: fc.integer({ min: 1, max: 5 }), deviceId: fc.integer({ min: 1, max: 3 }), fence: fc.integer({ min: 1, max: 4 }) })

/** A legal timeline from the empty one, each event accepted one millisecond after its device time. */
const timeline = fc.array(fc.nat({ max: 50 }), { maxLength: 12 }).map((choices) => {
  const out: Array<WorkerWrite.StoredEvent> = []
  let t: PhaseModel.Timeline = PhaseModel.empty
  let at = T0
  for (const c of choices) {
    at += c
    const options = PhaseModel.phases.filter((p) => PhaseModel.canTransition(t.phase, p))
    if (options.length === 0) break
    const e: PhaseModel.Event = { seq: t.lastSeq + 1, kind: "phase", phase: options[c % options.length], at }
    t = Either.getOrThrow(PhaseModel.append(t, e))
    out.push({ ...e, acceptedAt: at + 1 })
  }
  return out
})

describe("WorkerWrite.authorize", () => {
  it.prop(
    "a write is authorized exactly when the reservation exists, belongs to the device and carries its fence, and the refusal names the first mismatch",
    [auth, fc.option(reservation, { nil: undefined })],
    ([w, a]) => {
      const r = WorkerWrite.authorize(w, a)
      if (a === undefined) expect(Either.isLeft(r) && r.left.reason).toBe("not_found")
      else if (a.deviceId !== w.deviceId) expect(Either.isLeft(r) && r.left.reason).toBe("not_owner")
      else if (a.fence !== w.fence) expect(Either.isLeft(r) && r.left.reason).toBe("stale_fence")
      else expect(r).toEqual(Either.right(a))
    }
  )
})

describe("WorkerWrite.receiptId", () => {
  it.prop(
    "receipt ids are equal exactly when reservation and fence are equal",
    [fc.nat(), fc.nat(), fc.nat(), fc.nat()],
    ([r1, f1, r2, f2]) => {
      expect(WorkerWrite.receiptId(r1, f1) === WorkerWrite.receiptId(r2, f2)).toBe(r1 === r2 && f1 === f2)
    }
  )
})

describe("WorkerWrite.judgeResult", () => {
  const outcome = fc.constantFrom(...Assignment.outcomes)
  it.prop(
    "a result is accepted only for the owner's live reservation within the upload deadline on a held target, and a repeat returns the first receipt",
    [reservation, outcome, fc.integer({ min: T0, max: T0 + 3 * 86_400_000 }), fc.boolean()],
    ([a, o, now, held]) => {
      const t: Target.Target = { ...Target.admit(a.targetId, { source: a.source, identity: a.identity, remoteAt: null }, T0), status: held ? "in_progress" : "pending", fence: a.fence }
      const input = { reservationId: a.reservationId, deviceId: a.deviceId, fence: a.fence, now, outcome: o }
      const judged = WorkerWrite.judgeResult(input, a, () => t)
      const ended = a.state === "completed" || a.state === "failed"
      if (ended) {
        const prior = WorkerWrite.priorReceipt(a)
        expect(judged).toEqual(prior === null ? Either.left(expect.anything()) : Either.right({ _tag: "repeat", receipt: prior }))
        return
      }
      const accepted = a.state === "active" && now < a.expiresAt && now <= a.uploadDeadline && held
      expect(Either.isRight(judged)).toBe(accepted)
      if (Either.isRight(judged) && judged.right._tag === "accept") {
        expect(judged.right).toEqual({
          _tag: "accept",
          receipt: { receiptId: WorkerWrite.receiptId(a.reservationId, a.fence), reservationId: a.reservationId, outcome: o, acceptedAt: now },
          targetStatus: Assignment.targetStatusAfter(o),
          state: Assignment.targetStatusAfter(o) === "completed" ? "completed" : "failed"
        })
        // What the store then keeps on the reservation answers the repeat with the same receipt.
        const after: Assignment.Assignment = { ...a, state: judged.right.state, outcome: o, endedAt: now }
        expect(WorkerWrite.judgeResult(input, after, () => t)).toEqual(Either.right({ _tag: "repeat", receipt: judged.right.receipt }))
      }
    }
  )
})

describe("WorkerWrite.planProgress", () => {
  it.prop(
    "resending any prefix of a stored timeline with its continuation answers the prefix as duplicates with their first acceptance and accepts exactly the rest",
    [timeline, fc.nat(), fc.nat()],
    ([events, cut, from]) => {
      const k = events.length === 0 ? 0 : cut % (events.length + 1)
      const start = k === 0 ? 0 : from % k
      const stored = events.slice(0, k)
      const last = stored[stored.length - 1]
      const a = { reservationId: 1, state: "active", expiresAt: Number.POSITIVE_INFINITY, lastSeq: k, lastPhase: last?.phase ?? null } as Assignment.Assignment
      const batch = events.slice(start).map(({ acceptedAt: _, ...e }) => e)
      const now = T0 + 999
      const plan = Either.getOrThrow(WorkerWrite.planProgress(a, stored, batch, now))
      expect(plan.results).toEqual(events.slice(start).map((e) => (e.seq <= k ? { seq: e.seq, status: "duplicate", acceptedAt: e.acceptedAt } : { seq: e.seq, status: "accepted", acceptedAt: now })))
      expect(plan.fresh.map((e) => e.seq)).toEqual(events.slice(k).map((e) => e.seq))
      const end = events[events.length - 1]
      expect(plan.assignment.lastSeq).toBe(end?.seq ?? 0)
      if (plan.fresh.length > 0) expect(plan.assignment.lastPhase).toBe(end.phase)
    }
  )

  it.prop(
    "an event a batch repeats from its own fresh events is a duplicate accepted at this batch's time when identical and refuses the batch as a conflict when changed",
    [timeline, fc.nat(), fc.nat(), fc.boolean()],
    ([events, cut, pick, changed]) => {
      const k = cut % (events.length + 1)
      if (k === events.length) return
      const stored = events.slice(0, k)
      const a = { reservationId: 1, state: "active", expiresAt: Number.POSITIVE_INFINITY, lastSeq: k, lastPhase: stored[k - 1]?.phase ?? null } as Assignment.Assignment
      const fresh = events.slice(k).map(({ acceptedAt: _, ...e }) => e)
      const again = fresh[pick % fresh.length]
      const now = T0 + 999
      const r = WorkerWrite.planProgress(a, stored, [...fresh, changed ? { ...again, at: again.at + 1 } : again], now)
      if (changed) expect(Either.isLeft(r) && r.left).toMatchObject({ _tag: "ProgressRejected", reason: "conflict", seq: again.seq })
      else {
        const plan = Either.getOrThrow(r)
        expect(plan.results[plan.results.length - 1]).toEqual({ seq: again.seq, status: "duplicate", acceptedAt: now })
        expect(plan.fresh.map((e) => e.seq)).toEqual(fresh.map((e) => e.seq))
      }
    }
  )

  it.prop(
    "a batch whose fresh events the phase model refuses is refused as a whole, and a reservation that is not live refuses fresh events",
    [timeline, fc.constantFrom(...PhaseModel.phases), fc.constantFrom(...Assignment.states)],
    ([events, phase, state]) => {
      const a = { reservationId: 1, state, expiresAt: Number.POSITIVE_INFINITY, lastSeq: 0, lastPhase: null } as Assignment.Assignment
      const batch = [...events.map(({ acceptedAt: _, ...e }) => e), { seq: events.length + 1, kind: "phase" as const, phase, at: T0 + 10_000 }]
      const r = WorkerWrite.planProgress(a, [], batch, T0)
      const modelOk = Either.isRight(PhaseModel.reduce(batch))
      if (state !== "active") expect(Either.isLeft(r) && r.left._tag).toBe("ReservationRefused")
      else expect(Either.isRight(r)).toBe(modelOk)
    }
  )
})

describe("WorkerWrite.durationsOfEnded", () => {
  it.prop(
    "an ended reservation yields one end-to-end duration, an upload duration exactly when it entered uploading, and only non-negative durations stamped at its end",
    [timeline, source, fc.constantFrom(...Assignment.outcomes), fc.integer({ min: 0, max: 86_400_000 })],
    ([events, s, o, after]) => {
      const endedAt = T0 + after
      const ds = WorkerWrite.durationsOfEnded({ source: s, issuedAt: T0 }, events, o, endedAt)
      expect(ds.filter((d) => d.metric === "end_to_end")).toEqual([{ source: s, metric: "end_to_end", outcome: o, ms: after, at: endedAt }])
      const uploading = events.find((e) => e.phase === "uploading")
      expect(ds.filter((d) => d.metric === "upload").map((d) => d.ms)).toEqual(uploading ? [Math.max(0, endedAt - uploading.acceptedAt)] : [])
      expect(ds.every((d) => d.ms >= 0 && d.at === endedAt && d.source === s && d.outcome === o)).toBe(true)
    }
  )
})
