import { describe, expect, it } from "@effect/vitest"
import { Either, FastCheck as fc } from "effect"
import { Assignment, PhaseModel } from "@scanfleet/core"
import { T0 } from "./fixtures/arbitraries.js"

type Phase = PhaseModel.Phase
type Event = PhaseModel.Event

const idx = (p: Phase) => PhaseModel.phases.indexOf(p)
const isUpload = (p: Phase) => (PhaseModel.uploadStage as ReadonlyArray<string>).includes(p)

/** The transition rule restated from the phase model's definition, as an oracle. */
const legal = (from: Phase | null, to: Phase): boolean => {
  if (from === null) return to === "assigned"
  if (PhaseModel.isTerminal(from)) return false
  if (to === "completed") return isUpload(from)
  if (PhaseModel.isTerminal(to)) return true
  return idx(to) > idx(from)
}

/** The phases a timeline may move to next. */
const successors = (from: Phase | null): ReadonlyArray<Phase> => PhaseModel.phases.filter((p) => legal(from, p))

/**
 * A legal timeline built from random choices: each choice picks the next phase
 * among the legal ones, or (when odd) records a recovery of the current phase.
 */
const legalTimeline = fc.array(fc.nat(), { maxLength: 25 }).map((choices) => {
  const events: Array<Event> = []
  let phase: Phase | null = null
  let at = T0
  for (const c of choices) {
    if (phase !== null && PhaseModel.isTerminal(phase)) break
    at += c % 7
    if (phase !== null && c % 5 === 1) {
      events.push({ seq: events.length + 1, kind: "recovered", phase, at })
      continue
    }
    const next = successors(phase)
    phase = next[c % next.length]
    events.push({ seq: events.length + 1, kind: "phase", phase, at })
  }
  return events
})

/** A legal timeline with at most one event altered in sequence, kind or phase. */
const corrupted = fc
  .tuple(legalTimeline, fc.nat(), fc.constantFrom("seq", "kind", "phase", "none"), fc.integer({ min: -3, max: 3 }), fc.constantFrom(...PhaseModel.phases))
  .map(([events, i, what, dseq, phase]) => {
    if (events.length === 0 || what === "none") return events
    const k = i % events.length
    const e = events[k]
    const changed: Event =
      what === "seq" ? { ...e, seq: Math.max(1, e.seq + dseq) } : what === "kind" ? { ...e, kind: e.kind === "phase" ? "recovered" : "phase" } : { ...e, phase }
    return events.map((x, j) => (j === k ? changed : x))
  })

describe("PhaseModel", () => {
  it.prop("the timeline reducer refuses non-monotonic or illegal events, and only those", [corrupted], ([events]) => {
    let phase: Phase | null = null
    let last = 0
    let refusedAt: number | null = null
    for (const [i, e] of events.entries()) {
      const ok =
        e.seq === last + 1 &&
        (phase === null || !PhaseModel.isTerminal(phase)) &&
        (e.kind === "recovered" ? phase !== null && e.phase === phase : legal(phase, e.phase))
      if (!ok) {
        refusedAt = i
        break
      }
      phase = e.phase
      last = e.seq
    }
    const r = PhaseModel.reduce(events)
    if (refusedAt === null) {
      expect(Either.isRight(r)).toBe(true)
      if (Either.isRight(r)) expect(r.right).toEqual({ events, phase, lastSeq: last })
    } else {
      expect(Either.isLeft(r)).toBe(true)
      if (Either.isLeft(r)) expect(r.left.seq).toBe(events[refusedAt].seq)
    }
  })

  it.prop("an accepted timeline has strictly increasing sequence numbers and never revisits a phase", [legalTimeline], ([events]) => {
    const t = Either.getOrThrow(PhaseModel.reduce(events))
    const phases = t.events.filter((e) => e.kind === "phase").map((e) => e.phase)
    t.events.forEach((e, i) => expect(e.seq).toBe(i + 1))
    expect(new Set(phases).size).toBe(phases.length)
    for (let i = 1; i < phases.length; i++) expect(idx(phases[i])).toBeGreaterThan(idx(phases[i - 1]))
  })

  it.prop(
    "sequence numbers stay strictly increasing across any interleaving of restarts",
    [fc.array(fc.oneof(fc.record({ op: fc.constant("advance" as const), pick: fc.nat() }), fc.constant({ op: "restart" as const }), fc.constant({ op: "crash_before_persist" as const, pick: 0 })), { maxLength: 40 })],
    ([ops]) => {
      // What survives a restart: the journal and the last sequence, written together.
      let persisted = { journal: [] as Array<Event>, lastSeq: 0, phase: null as Phase | null }
      // What the server accepted, in arrival order.
      const server: Array<Event> = []
      let at = T0
      let restarts = 0
      const snapshots: Array<ReadonlyArray<Event>> = []
      for (const o of ops) {
        at += 1
        if (persisted.phase !== null && PhaseModel.isTerminal(persisted.phase)) break
        if (o.op === "restart") {
          if (persisted.phase === null) continue
          snapshots.push([...persisted.journal])
          const e: Event = { seq: persisted.lastSeq + 1, kind: "recovered", phase: persisted.phase, at }
          persisted = { journal: [...persisted.journal, e], lastSeq: e.seq, phase: persisted.phase }
          server.push(e)
          restarts++
          continue
        }
        const next = successors(persisted.phase)
        const e: Event = { seq: persisted.lastSeq + 1, kind: "phase", phase: next[o.pick % next.length], at }
        // A crash before the write loses the event: it was never sent, so its number is free again.
        if (o.op === "crash_before_persist") continue
        persisted = { journal: [...persisted.journal, e], lastSeq: e.seq, phase: e.phase }
        server.push(e)
      }
      const t = Either.getOrThrow(PhaseModel.reduce(server))
      for (let i = 1; i < t.events.length; i++) expect(t.events[i].seq).toBeGreaterThan(t.events[i - 1].seq)
      expect(t.events.filter((e) => e.kind === "recovered")).toHaveLength(restarts)
      // Recovery never rewrites: what was there before each restart is a prefix of the final timeline.
      for (const s of snapshots) expect(t.events.slice(0, s.length)).toEqual(s)
      expect(t.lastSeq).toBe(persisted.lastSeq)
    }
  )

  it("a timeline stays within maxSeq: a recovery past lastRecoverySeq is refused, and from every phase the longest rest still fits", () => {
    for (const phase of PhaseModel.phases.filter((p) => !PhaseModel.isTerminal(p))) {
      const before: PhaseModel.Timeline = { events: [], phase, lastSeq: PhaseModel.lastRecoverySeq - 1 }
      const recovered = Either.getOrThrow(PhaseModel.append(before, { seq: PhaseModel.lastRecoverySeq, kind: "recovered", phase, at: T0 }))
      const refused = PhaseModel.append(recovered, { seq: recovered.lastSeq + 1, kind: "recovered", phase, at: T0 })
      expect(Either.isLeft(refused) && refused.left.reason).toBe("illegal_transition")
      // The longest legal rest: every later non-terminal phase in order, then a terminal.
      let t = recovered
      for (const next of PhaseModel.phases.filter((p) => !PhaseModel.isTerminal(p) && idx(p) > idx(phase)))
        t = Either.getOrThrow(PhaseModel.append(t, { seq: t.lastSeq + 1, kind: "phase", phase: next, at: T0 }))
      t = Either.getOrThrow(PhaseModel.append(t, { seq: t.lastSeq + 1, kind: "phase", phase: "failed", at: T0 }))
      expect(t.lastSeq).toBeLessThanOrEqual(PhaseModel.maxSeq)
    }
    expect(PhaseModel.EventSchema.safeParse({ seq: PhaseModel.maxSeq, kind: "phase", phase: "failed", at: T0 }).success).toBe(true)
    expect(PhaseModel.EventSchema.safeParse({ seq: PhaseModel.maxSeq + 1, kind: "phase", phase: "failed", at: T0 }).success).toBe(false)
  })

  it.prop("nothing is accepted after a terminal phase", [legalTimeline, fc.constantFrom(...PhaseModel.phases), fc.boolean()], ([events, phase, recovered]) => {
    const t = Either.getOrThrow(PhaseModel.reduce(events))
    if (t.phase === null || !PhaseModel.isTerminal(t.phase)) return
    const r = PhaseModel.append(t, { seq: t.lastSeq + 1, kind: recovered ? "recovered" : "phase", phase, at: T0 })
    expect(Either.isLeft(r) && r.left.reason).toBe("terminal")
  })

  it.prop("spans tile the timeline: each phase ends where the next begins, and recoveries do not split a phase", [legalTimeline], ([events]) => {
    const spans = PhaseModel.spans(events)
    const moves = events.filter((e) => e.kind === "phase")
    expect(spans.map((s) => s.phase)).toEqual(moves.filter((e) => !PhaseModel.isTerminal(e.phase)).map((e) => e.phase))
    for (let i = 1; i < spans.length; i++) expect(spans[i].start).toBe(spans[i - 1].end)
    for (const s of spans) if (s.end !== null) expect(s.end).toBeGreaterThanOrEqual(s.start)
    const ended = moves.length > 0 && PhaseModel.isTerminal(moves[moves.length - 1].phase)
    if (spans.length > 0) expect(spans[spans.length - 1].leftBy).toBe(ended ? "terminal" : "open")
  })

  it.prop(
    "durations come only from completed phases",
    [legalTimeline, fc.constantFrom(...Assignment.outcomes), fc.option(fc.integer({ min: T0, max: T0 + 500 }), { nil: null })],
    ([events, outcome, uploadStartedAt]) => {
      const acceptedAt = T0 + 1000
      const ds = Assignment.durationsOf({ source: "dockerhub", issuedAt: T0 - 5 }, events, outcome, acceptedAt, uploadStartedAt)
      const moves = events.filter((e) => e.kind === "phase")
      for (const metric of ["scanning", "cleanup", "bundling"] as const) {
        const i = moves.findIndex((e) => e.phase === metric)
        // A phase completed when the timeline moved on from it to another non-terminal phase.
        const done = i >= 0 && i + 1 < moves.length && !PhaseModel.isTerminal(moves[i + 1].phase)
        const got = ds.filter((d) => d.metric === metric)
        expect(got).toEqual(done ? [{ source: "dockerhub", metric, outcome, ms: moves[i + 1].at - moves[i].at, at: acceptedAt }] : [])
      }
      expect(ds.filter((d) => d.metric === "end_to_end")).toEqual([{ source: "dockerhub", metric: "end_to_end", outcome, ms: 1005, at: acceptedAt }])
      expect(ds.filter((d) => d.metric === "upload")).toHaveLength(uploadStartedAt === null ? 0 : 1)
      for (const d of ds) expect(d.ms).toBeGreaterThanOrEqual(0)
    }
  )

  it.prop("every event the model accepts fits the event schema", [legalTimeline], ([events]) => {
    for (const e of events) expect(PhaseModel.EventSchema.parse(e)).toEqual(e)
  })
})
