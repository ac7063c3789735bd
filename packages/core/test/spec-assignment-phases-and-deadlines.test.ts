import { describe, expect, it } from "@effect/vitest"
import { Either } from "effect"
import { Assignment, Config, Deadline, Percentile, PhaseModel } from "@scanfleet/core"
import { attempt, fleet, ok } from "./fixtures/memory.js"

const SEC = 1000
const MIN = 60 * SEC
const t0 = Date.UTC(2025, 2, 1)

/** The phase events of a normal run, one every `step` ms from `start`. */
const normalRun = (start: number, step: number): Array<PhaseModel.Event> =>
  (["assigned", "permit_wait", "preparing", "acquiring", "scanning", "filtering", "cleanup", "staging", "bundling", "uploading", "awaiting_receipt", "completed"] as const).map(
    (phase, i) => ({ seq: i + 1, kind: "phase", phase, at: start + i * step })
  )

describe("spec: assignment-phases-and-deadlines (pure rules and the reference store)", () => {
  describe("Requirement: Canonical assignment phase model", () => {
    it("Assignment completes normally", () => {
      const events = normalRun(t0, 10 * SEC)
      const timeline = Either.getOrThrow(PhaseModel.reduce(events))
      expect(timeline.phase).toBe("completed")
      expect(timeline.lastSeq).toBe(events.length)
      for (let i = 1; i < events.length; i++) expect(events[i].seq).toBeGreaterThan(events[i - 1].seq)
      // The spans reconstruct the time spent from `assigned` through `awaiting_receipt`, with no gap.
      const spans = PhaseModel.spans(timeline.events)
      expect(spans[0].phase).toBe("assigned")
      expect(spans[spans.length - 1]).toEqual({ phase: "awaiting_receipt", start: t0 + 100 * SEC, end: t0 + 110 * SEC, leftBy: "terminal" })
      expect(spans.reduce((sum, s) => sum + (s.end! - s.start), 0)).toBe(110 * SEC)
      // The durations it contributes: every completed phase metric, upload and end to end.
      const ds = Assignment.durationsOf({ source: "github", issuedAt: t0 }, timeline.events, "clean", t0 + 110 * SEC, t0 + 90 * SEC)
      expect(Object.fromEntries(ds.map((d) => [d.metric, d.ms]))).toEqual({ end_to_end: 110 * SEC, scanning: 10 * SEC, cleanup: 10 * SEC, bundling: 10 * SEC, upload: 20 * SEC })
      // Out of order or repeated phases are refused.
      expect(Either.isLeft(PhaseModel.reduce([events[0], events[2]]))).toBe(true)
      expect(Either.isLeft(PhaseModel.reduce([events[0], { ...events[4], seq: 2 }, { ...events[3], seq: 3 }]))).toBe(true)
    })

    it("Process restarts during an assignment", () => {
      const before = normalRun(t0, SEC).slice(0, 5) // up to `scanning`, seq 1..5, as persisted by the slot
      const persisted = { lastSeq: 5, phase: "scanning" as const, journal: before }
      // The restarted worker continues from the persisted sequence and records the recovery.
      const recovered: PhaseModel.Event = { seq: persisted.lastSeq + 1, kind: "recovered", phase: persisted.phase, at: t0 + MIN, detail: "worker restarted" }
      const after: PhaseModel.Event = { seq: 7, kind: "phase", phase: "filtering", at: t0 + MIN + SEC }
      const timeline = Either.getOrThrow(PhaseModel.reduce([...persisted.journal, recovered, after]))
      expect(timeline.events.slice(0, 5)).toEqual(before)
      expect(timeline.events.map((e) => e.seq)).toEqual([1, 2, 3, 4, 5, 6, 7])
      // A recovery that reuses a sequence, or rewrites the phase, is refused.
      expect(Either.isLeft(PhaseModel.reduce([...before, { ...recovered, seq: 5 }]))).toBe(true)
      expect(Either.isLeft(PhaseModel.reduce([...before, { ...recovered, phase: "assigned" }]))).toBe(true)
      // The server keeps the earlier timeline too.
      const f = fleet()
      ok(f.store.recordObservations([{ source: "github", identity: "acme/widget", remoteAt: null }], t0))
      const a = f.claim(t0)!
      ok(f.store.appendProgress(f.authority(a, t0 + SEC), before))
      const first = ok(f.store.timeline(a.reservationId))
      ok(f.store.appendProgress(f.authority(a, t0 + MIN), [...before, recovered, after]))
      const stored = ok(f.store.timeline(a.reservationId))
      expect(stored.slice(0, 5)).toEqual(first)
      expect(stored.map((e) => e.kind)).toEqual(["phase", "phase", "phase", "phase", "phase", "recovered", "phase"])
    })
  })

  describe("Requirement: Non-renewing server progress", () => {
    it("Progress is accepted", () => {
      const f = fleet()
      ok(f.store.recordObservations([{ source: "gitlab", identity: "acme/tool", remoteAt: null }], t0))
      const a = f.claim(t0)!
      const events = normalRun(t0, SEC).slice(0, 3)
      const r = ok(f.store.appendProgress(f.authority(a, t0 + 5 * SEC), events))
      expect(r.results).toEqual(events.map((e) => ({ seq: e.seq, status: "accepted", acceptedAt: t0 + 5 * SEC })))
      const now = ok(f.store.getAssignment(a.reservationId))
      expect([now.lastPhase, now.lastSeq, now.lastProgressAt]).toEqual(["preparing", 3, t0 + 5 * SEC])
      // Nothing renewed, nothing changed hands.
      expect({ ...now, lastPhase: a.lastPhase, lastSeq: a.lastSeq, lastProgressAt: a.lastProgressAt }).toEqual(a)
      // Events for a reservation held under another fence, or another device, are refused.
      const stale = attempt(f.store.appendProgress({ ...f.authority(a, t0 + 6 * SEC), fence: a.fence - 1 }, [{ ...events[2], seq: 4, phase: "acquiring" }]))
      expect(Either.isLeft(stale) && stale.left._tag).toBe("ReservationRefused")
    })

    it("Duplicate progress is retried", () => {
      const f = fleet()
      ok(f.store.recordObservations([{ source: "gitlab", identity: "acme/tool", remoteAt: null }], t0))
      const a = f.claim(t0)!
      const events = normalRun(t0, SEC).slice(0, 4)
      ok(f.store.appendProgress(f.authority(a, t0 + 5 * SEC), events.slice(0, 3)))
      // The retry repeats two accepted events and brings one new one.
      const r = ok(f.store.appendProgress(f.authority(a, t0 + 9 * SEC), events.slice(1)))
      expect(r.results).toEqual([
        { seq: 2, status: "duplicate", acceptedAt: t0 + 5 * SEC },
        { seq: 3, status: "duplicate", acceptedAt: t0 + 5 * SEC },
        { seq: 4, status: "accepted", acceptedAt: t0 + 9 * SEC }
      ])
      expect(ok(f.store.timeline(a.reservationId)).map((e) => e.seq)).toEqual([1, 2, 3, 4])
      // The same sequence with different content is a conflict, not a duplicate.
      const clash = attempt(f.store.appendProgress(f.authority(a, t0 + 10 * SEC), [{ ...events[1], at: events[1].at + 1 }]))
      expect(Either.isLeft(clash) && clash.left._tag === "ProgressRejected" && clash.left.reason).toBe("conflict")
    })
  })

  describe("Requirement: Observable deadline semantics", () => {
    it("Operator inspects active work", () => {
      const f = fleet()
      ok(f.store.recordObservations([{ source: "dockerhub", identity: "library/nginx:1@sha256:aa", remoteAt: null }], t0))
      const a = f.claim(t0)!
      ok(f.store.appendProgress(f.authority(a, t0 + MIN), normalRun(t0, SEC).slice(0, 5)))
      const view = ok(f.store.getAssignment(a.reservationId))
      // Three distinct deadlines, each labelled by its meaning; none of them is "the deadline".
      expect(new Set(Object.values(Deadline.labels)).size).toBe(3)
      expect(Object.values(Deadline.labels)).not.toContain("deadline")
      expect(view.scanDeadline).toBe(t0 + Config.defaults.sources.dockerhub.scanTimeoutSeconds * SEC)
      expect(view.expiresAt).toBe(t0 + Config.defaults.assignments.globalTtlSeconds * SEC)
      const next = Deadline.next(view, t0 + MIN)!
      expect(next).toEqual({ which: "scanDeadline", label: "target-scan deadline", at: view.scanDeadline, remainingMs: view.scanDeadline - (t0 + MIN) })
      expect(view.lastPhase).toBe("scanning")
      // Past the scan deadline the next one is named for what it is.
      expect(Deadline.next(view, view.scanDeadline)!.label).toBe(view.expiresAt < view.uploadDeadline ? "assignment expiry" : "result-upload deadline")
    })

    it("Assignment expires", () => {
      const f = fleet()
      ok(f.store.recordObservations([{ source: "github", identity: "acme/widget", remoteAt: null }], t0))
      const a = f.claim(t0)!
      ok(f.store.appendProgress(f.authority(a, t0 + 2 * MIN), normalRun(t0, SEC).slice(0, 6)))
      expect(ok(f.store.expireDue({ now: a.expiresAt - 1, maxAttempts: 3, limit: 10 }))).toEqual([])
      const [expired] = ok(f.store.expireDue({ now: a.expiresAt, maxAttempts: 3, limit: 10 }))
      expect(expired.state).toBe("expired")
      expect(expired.expiry).toEqual({ lastPhase: "filtering", lastProgressAt: t0 + 2 * MIN, expiredAt: a.expiresAt })
      expect(ok(f.store.getTarget("github", "acme/widget")).status).toBe("pending")
      // Without any accepted progress the evidence says so.
      const b = f.claim(a.expiresAt)!
      const [silent] = ok(f.store.expireDue({ now: b.expiresAt, maxAttempts: 3, limit: 10 }))
      expect(silent.expiry).toEqual({ lastPhase: null, lastProgressAt: null, expiredAt: b.expiresAt })
    })
  })

  describe("Requirement: Global and per-source assignment policy", () => {
    const withDockerOverride: Config.ManagedConfig = {
      ...Config.defaults,
      assignments: { ...Config.defaults.assignments, globalTtlSeconds: 3600, overrides: { dockerhub: { ttlSeconds: 7200 } } }
    }

    it("Source override exists", () => {
      const { policy, deadlines } = Deadline.issueFor(withDockerOverride, "dockerhub", t0)
      expect(policy).toMatchObject({ source: "dockerhub", origin: "override", ttlSeconds: 7200 })
      expect(deadlines.expiresAt).toBe(t0 + 7200 * SEC)
      // The issued assignment reports that policy, and it stays fixed.
      const f = fleet()
      ok(f.store.recordObservations([{ source: "dockerhub", identity: "library/redis:7@sha256:bb", remoteAt: null }], t0))
      const a = f.claim(t0, withDockerOverride)!
      expect(a.policy).toEqual(policy)
      expect(a.expiresAt).toBe(t0 + 7200 * SEC)
    })

    it("Source override is absent", () => {
      for (const source of ["github", "gitlab", "huggingface"] as const) {
        const { policy, deadlines } = Deadline.issueFor(withDockerOverride, source, t0)
        expect(policy).toMatchObject({ origin: "global", ttlSeconds: 3600 })
        expect(deadlines.expiresAt).toBe(t0 + 3600 * SEC)
      }
    })

    it("Invalid deadline policy is previewed", () => {
      const candidate = {
        ...Config.defaults,
        assignments: { globalTtlSeconds: 1800, handoffMarginSeconds: 120, overrides: { huggingface: { ttlSeconds: 3000 } } }
      }
      const r = Config.preview(candidate)
      expect(Either.isLeft(r)).toBe(true)
      const violations = Either.isLeft(r) ? r.left : []
      expect(violations.map((v) => v.path.join("."))).toEqual([
        "assignments.globalTtlSeconds", // github: 1800 < 1800 + 300 + 120
        "assignments.globalTtlSeconds", // gitlab
        "assignments.overrides.huggingface.ttlSeconds", // 3000 < 2700 + 300 + 120
        "assignments.globalTtlSeconds" // dockerhub: 1800 < 2700 + 600 + 120
      ])
      expect(violations[2].message).toContain("sources.huggingface.scanTimeoutSeconds = 2700 s")
      expect(violations[2].message).toContain("assignments.handoffMarginSeconds = 120 s")
      expect(violations[2].message).toContain("at least 3120")
      // A shape error names its field as well.
      const typo = Config.preview({ ...Config.defaults, expiry: { maxAttempts: 0 } })
      expect(Either.isLeft(typo) && typo.left.map((v) => v.path.join("."))).toEqual(["expiry.maxAttempts"])
    })
  })

  describe("Requirement: Phase duration percentiles", () => {
    it("Administrator reviews DockerHub latency", () => {
      const f = fleet(1)
      const n = 5
      ok(f.store.recordObservations(Array.from({ length: n }, (_, i) => ({ source: "dockerhub" as const, identity: `library/app:${i}@sha256:${i}`, remoteAt: null })), t0))
      for (let i = 0; i < n; i++) {
        const start = t0 + i * 10 * MIN
        const a = f.claim(start)!
        const events = normalRun(start, (i + 1) * SEC)
        ok(f.store.appendProgress(f.authority(a, start + 10 * (i + 1) * SEC), events.slice(0, -1)))
        f.finish(a, start + 11 * (i + 1) * SEC)
      }
      const rows = ok(f.store.percentiles({ from: t0, to: t0 + 60 * MIN, source: "dockerhub", minSamples: 3 }))
      expect(rows.map((r) => r.metric).sort()).toEqual(["bundling", "cleanup", "end_to_end", "scanning", "upload"])
      for (const r of rows) {
        expect(r.source).toBe("dockerhub")
        expect(r.count).toBe(n)
        expect(r.p50.status).toBe("ok")
      }
      // The store reads percentiles from log-bucket counts: within Percentile.accuracy of exact percentile_cont.
      const scanning = rows.find((r) => r.metric === "scanning")!
      const near = (q: Percentile.Quantile, exact: number) => {
        expect(q.status).toBe("ok")
        expect(Math.abs((q as { value: number }).value - exact)).toBeLessThanOrEqual(Percentile.accuracy * exact)
      }
      near(scanning.p50, 3 * SEC)
      near(scanning.p95, Percentile.cont([1, 2, 3, 4, 5].map((x) => x * SEC), 0.95))
    })

    it("Insufficient samples exist", () => {
      const s = Percentile.summarize([120, 80, 95], 20)
      expect(s).toEqual({
        count: 3,
        p50: { status: "insufficient", count: 3, required: 20 },
        p95: { status: "insufficient", count: 3, required: 20 },
        p99: { status: "insufficient", count: 3, required: 20 }
      })
      expect(Percentile.summarize(Array.from({ length: 20 }, (_, i) => i), 20).p50).toEqual({ status: "ok", value: 9.5 })
      const f = fleet()
      ok(f.store.recordDurations([{ source: "gitlab", metric: "scanning", outcome: "clean", ms: 1000, at: t0 }]))
      expect(ok(f.store.percentiles({ from: t0, to: t0 + 1, minSamples: 2 }))[0].p99).toEqual({ status: "insufficient", count: 1, required: 2 })
    })
  })
})
