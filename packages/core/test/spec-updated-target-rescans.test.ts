import { describe, expect, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import { Claim, Config, Discovery, Promotion, RemoteTimestamp, Target } from "@scanfleet/core"
import { attempt, fleet, ok } from "./fixtures/memory.js"

const MIN = 60_000
const HOUR = 60 * MIN
const DAY = 24 * HOUR
const t0 = Date.UTC(2025, 2, 1)
const iso = (ms: number) => new Date(ms).toISOString()
const rule = (budget = 10, cooldownMs = DAY) => ({ budget, cooldownMs })

/** A store holding one completed GitHub target whose scan covered `covered`. */
const completedTarget = (covered: number, identity = "acme/widget") => {
  const f = fleet()
  ok(f.store.recordObservations([{ source: "github", identity, remoteAt: covered }], t0))
  const a = f.claim(t0)!
  f.finish(a, t0 + 10 * MIN)
  return { ...f, assignment: a, get: () => ok(f.store.getTarget("github", identity)) }
}

describe("spec: updated-target-rescans", () => {
  describe("Requirement: Discovery preserves remote content recency", () => {
    it("Source-specific remote timestamp is retained", () => {
      const now = t0
      const records = [
        { source: "github", record: { full_name: "acme/widget", pushed_at: "2025-02-27T08:30:00Z", updated_at: "2025-01-01T00:00:00Z" } },
        { source: "gitlab", record: { path_with_namespace: "acme/tool", last_activity_at: "2025-02-27T10:30:00.123+02:00" } },
        { source: "huggingface", record: { id: "acme/model", lastModified: "2025-02-27T08:30:00.000Z", createdAt: "2021-01-01T00:00:00.000Z" } }
      ] as const
      const f = fleet()
      const batch = records.map(({ source, record }) => ({
        source,
        identity: Object.values(record)[0],
        remoteAt: RemoteTimestamp.fromRecord(source, record, now) ?? null
      }))
      expect(batch.map((o) => o.remoteAt)).toEqual([Date.UTC(2025, 1, 27, 8, 30), Date.UTC(2025, 1, 27, 8, 30, 0, 123), Date.UTC(2025, 1, 27, 8, 30)])
      ok(f.store.recordObservations(batch, now))
      for (const o of batch) expect(ok(f.store.getTarget(o.source, o.identity)).observedRemoteAt).toBe(o.remoteAt)
    })

    it("Missing or malformed remote timestamp", () => {
      const now = t0
      const f = fleet()
      const raw = [undefined, null, "", "yesterday", "2025-02-27T08:30:00", "2025-02-30T00:00:00Z", "1970-01-01T00:00:00Z", "2999-01-01T00:00:00Z", 1740645000000]
      const batch = raw.map((pushed_at, i) => ({ source: "github" as const, identity: `acme/r${i}`, remoteAt: RemoteTimestamp.fromRecord("github", { pushed_at }, now) ?? null }))
      expect(batch.every((o) => o.remoteAt === null)).toBe(true)
      // Still admitted as new targets.
      expect(ok(f.store.recordObservations(batch, now)).inserted).toEqual(batch.map((o) => o.identity))
      for (let i = 0; i < batch.length; i++) f.finish(f.claim(now)!, now + 1)
      // Rediscovered, still without a valid timestamp, long after any cooldown: never promoted.
      ok(f.store.recordObservations(batch, now + 30 * DAY))
      expect(ok(f.store.promote("github", rule(), now + 30 * DAY)).promoted).toEqual([])
      const t = ok(f.store.getTarget("github", "acme/r3"))
      expect(t.status).toBe("completed")
      expect(Promotion.decide(t, rule(), now + 30 * DAY)).toEqual({ _tag: "skip", reason: "no_valid_timestamp" })
    })

    it("DockerHub discovery", () => {
      const now = t0
      const f = fleet()
      const tag = (digest: string, last_updated: string) => ({
        source: "dockerhub" as const,
        identity: `library/nginx:1.27@${digest}`,
        remoteAt: RemoteTimestamp.fromRecord("dockerhub", { last_updated, tag_last_pushed: last_updated }, now) ?? null
      })
      expect(ok(f.store.recordObservations([tag("sha256:aaa", "2025-02-01T00:00:00Z")], now)).inserted).toEqual(["library/nginx:1.27@sha256:aaa"])
      f.finish(f.claim(now)!, now + 1)
      // The same digest, seen again with a newer date: known, not promoted.
      expect(ok(f.store.recordObservations([tag("sha256:aaa", "2025-02-28T00:00:00Z")], now + 30 * DAY))).toEqual({ inserted: [], known: 1 })
      expect(ok(f.store.promote("dockerhub", rule(), now + 30 * DAY)).promoted).toEqual([])
      const old = ok(f.store.getTarget("dockerhub", "library/nginx:1.27@sha256:aaa"))
      expect([old.status, old.observedRemoteAt]).toEqual(["completed", null])
      // A new digest is a new target: digest refresh stays the way DockerHub changes reach the queue.
      expect(ok(f.store.recordObservations([tag("sha256:bbb", "2025-02-28T00:00:00Z")], now + 30 * DAY)).inserted).toEqual(["library/nginx:1.27@sha256:bbb"])
      // Even a completed DockerHub row that somehow carried a newer time is never promoted as updated.
      expect(Promotion.decide({ ...old, observedRemoteAt: now + DAY, coveredRemoteAt: now }, rule(), now + 30 * DAY)).toEqual({ _tag: "skip", reason: "source_not_promotable" })
    })
  })

  describe("Requirement: Only changed completed targets are promoted", () => {
    it("Completed target changed after its covered revision", () => {
      const covered = Date.UTC(2025, 1, 1)
      const f = completedTarget(covered)
      const before = f.get()
      const now = t0 + 2 * DAY
      ok(f.store.recordObservations([{ source: "github", identity: "acme/widget", remoteAt: covered + HOUR }], now))
      expect(ok(f.store.promote("github", rule(), now))).toEqual({ promoted: ["acme/widget"], deferred: 0 })
      const promoted = f.get()
      expect(promoted.status).toBe("pending")
      expect(promoted.fence).toBe(before.fence + 1)
      // One normal fenced scan: claimed with the new fence, covering the new revision.
      const a = f.claim(now + 1)!
      expect(a.identity).toBe("acme/widget")
      expect(a.fence).toBe(promoted.fence + 1)
      expect(a.coveredRemoteAt).toBe(covered + HOUR)
      // The earlier reservation holds no authority any more.
      const stale = attempt(f.store.release(f.authority(f.assignment, now + 2)))
      expect(Either.isLeft(stale) && stale.left.reason).toBe("not_active")
      expect(ok(f.store.promote("github", rule(), now + 2))).toEqual({ promoted: [], deferred: 0 })
    })

    it("Unchanged target is rediscovered", () => {
      const covered = Date.UTC(2025, 1, 1)
      const f = completedTarget(covered)
      const before = f.get()
      const now = t0 + 10 * DAY
      for (const remoteAt of [covered, covered - DAY, null]) {
        ok(f.store.recordObservations([{ source: "github", identity: "acme/widget", remoteAt }], now))
        expect(ok(f.store.promote("github", rule(), now))).toEqual({ promoted: [], deferred: 0 })
        expect(f.get()).toEqual(before)
        // Unclaimable: nothing is pending.
        expect(f.claim(now)).toBeNull()
      }
    })

    it("Legacy completed target is first observed", () => {
      const completedAt = Date.UTC(2024, 5, 1)
      const legacy: Target.Target = {
        id: 7, source: "gitlab", identity: "acme/legacy", status: "completed",
        observedRemoteAt: null, coveredRemoteAt: null, completedAt, lastScanStartedAt: null, fence: 3, attempts: 1, discoveredAt: completedAt - DAY, priority: 0
      }
      const now = t0
      const seen = (remoteAt: number) => Target.observe(legacy, { source: "gitlab", identity: "acme/legacy", remoteAt })
      expect(Promotion.decide(seen(completedAt + 1), rule(), now)).toEqual({ _tag: "promote" })
      expect(Promotion.decide(seen(completedAt), rule(), now)).toEqual({ _tag: "skip", reason: "not_newer" })
      expect(Promotion.decide(seen(completedAt - DAY), rule(), now)).toEqual({ _tag: "skip", reason: "not_newer" })
      expect(Promotion.decide(legacy, rule(), now)).toEqual({ _tag: "skip", reason: "no_valid_timestamp" })
    })

    it("Non-completed target is rediscovered", () => {
      const now = t0
      // Pure rule, every non-completed status (leased, claimed and reserved are all `in_progress`).
      for (const status of Target.statuses.filter((s) => s !== "completed")) {
        const t: Target.Target = {
          id: 1, source: "github", identity: "acme/x", status, observedRemoteAt: t0 - DAY, coveredRemoteAt: t0 - 2 * DAY,
          completedAt: t0 - 2 * DAY, lastScanStartedAt: t0 - 3 * DAY, fence: 5, attempts: 1, discoveredAt: t0 - 9 * DAY, priority: 0
        }
        const seen = Target.observe(t, { source: "github", identity: "acme/x", remoteAt: now })
        expect(seen).toEqual({ ...t, observedRemoteAt: now })
        expect(Promotion.decide(seen, rule(0, 0), now)).toEqual({ _tag: "skip", reason: "not_completed" })
      }
      // Through the store: pending, in progress (claimed, leased, reserved), failed and unresolved rows.
      const f = fleet(8)
      const ids = ["pending", "in-progress", "failed", "unresolved"]
      ok(f.store.recordObservations(ids.map((identity) => ({ source: "github", identity, remoteAt: t0 - DAY })), t0 - DAY))
      const [a1, , a3, a4] = ids.map(() => f.claim(t0)!)
      ok(f.store.release(f.authority(a1, t0)))
      f.finish(a3, t0 + 1, "scan_error")
      f.finish(a4, t0 + 1, "unsupported")
      const before = ids.map((i) => ok(f.store.getTarget("github", i)))
      expect(before.map((t) => t.status)).toEqual(["pending", "in_progress", "failed", "unresolved"])
      ok(f.store.recordObservations(ids.map((identity) => ({ source: "github", identity, remoteAt: t0 + HOUR })), t0 + 30 * DAY))
      expect(ok(f.store.promote("github", rule(10, 0), t0 + 30 * DAY)).promoted).toEqual([])
      ids.forEach((i, k) => expect(ok(f.store.getTarget("github", i))).toEqual({ ...before[k], observedRemoteAt: t0 + HOUR }))
    })

    it("Update arrives during a scan", () => {
      const f = fleet()
      const r1 = Date.UTC(2025, 1, 1)
      ok(f.store.recordObservations([{ source: "huggingface", identity: "acme/space", remoteAt: r1 }], t0))
      const a = f.claim(t0)!
      expect(a.coveredRemoteAt).toBe(r1)
      // The site changes while the scan runs; discovery records it.
      ok(f.store.recordObservations([{ source: "huggingface", identity: "acme/space", remoteAt: r1 + HOUR }], t0 + 10 * MIN))
      f.finish(a, t0 + 20 * MIN)
      const done = ok(f.store.getTarget("huggingface", "acme/space"))
      expect([done.status, done.coveredRemoteAt, done.observedRemoteAt]).toEqual(["completed", r1, r1 + HOUR])
      // Bounded: nothing before the cooldown since the scan started...
      expect(ok(f.store.promote("huggingface", rule(10, DAY), t0 + DAY - 1)).promoted).toEqual([])
      // ...then exactly one follow-up...
      expect(ok(f.store.promote("huggingface", rule(10, DAY), t0 + DAY)).promoted).toEqual(["acme/space"])
      const b = f.claim(t0 + DAY)!
      expect(b.coveredRemoteAt).toBe(r1 + HOUR)
      f.finish(b, t0 + DAY + 20 * MIN)
      // ...and none after it.
      expect(ok(f.store.promote("huggingface", rule(10, 0), t0 + 9 * DAY)).promoted).toEqual([])
    })
  })

  describe("Requirement: Updated-target admission is bounded", () => {
    it("Eligible changes exceed the cycle budget", () => {
      const f = fleet(8)
      const names = ["a", "b", "c", "d", "e"]
      ok(f.store.recordObservations(names.map((identity) => ({ source: "gitlab", identity, remoteAt: t0 - DAY })), t0 - DAY))
      // Scanned at different times: e longest ago, a most recently.
      for (const [k] of names.entries()) f.finish(f.claim(t0 - k * HOUR)!, t0 - k * HOUR + 10 * MIN)
      const lastScans = names.map((n) => ok(f.store.getTarget("gitlab", n)).lastScanStartedAt)
      expect(lastScans).toEqual(names.map((_, k) => t0 - k * HOUR))
      ok(f.store.recordObservations(names.map((identity) => ({ source: "gitlab", identity, remoteAt: t0 })), t0 + DAY))
      const now = t0 + 2 * DAY
      const first = ok(f.store.promote("gitlab", rule(2, DAY), now))
      expect(first).toEqual({ promoted: ["e", "d"], deferred: 3 })
      // The rest stay completed and eligible.
      for (const n of ["a", "b", "c"]) {
        const t = ok(f.store.getTarget("gitlab", n))
        expect(t.status).toBe("completed")
        expect(Promotion.isEligible(t, rule(2, DAY), now)).toBe(true)
      }
      expect(ok(f.store.promote("gitlab", rule(2, DAY), now + 1))).toEqual({ promoted: ["c", "b"], deferred: 1 })
      expect(ok(f.store.promote("gitlab", rule(2, DAY), now + 2))).toEqual({ promoted: ["a"], deferred: 0 })
    })

    it("Cooldown has not elapsed", () => {
      const covered = Date.UTC(2025, 1, 1)
      const f = completedTarget(covered)
      ok(f.store.recordObservations([{ source: "github", identity: "acme/widget", remoteAt: covered + 1 }], t0 + HOUR))
      // The scan started at t0: within a day it stays completed, however often discovery runs.
      for (const now of [t0 + 2 * HOUR, t0 + 12 * HOUR, t0 + DAY - 1]) {
        expect(ok(f.store.promote("github", rule(10, DAY), now))).toEqual({ promoted: [], deferred: 0 })
        expect(f.get().status).toBe("completed")
        expect(Promotion.decide(f.get(), rule(10, DAY), now)).toEqual({ _tag: "skip", reason: "cooldown" })
      }
      expect(ok(f.store.promote("github", rule(10, DAY), t0 + DAY)).promoted).toEqual(["acme/widget"])
    })

    it.effect("Concurrent discovery cycles", () =>
      Effect.gen(function* () {
        const covered = Date.UTC(2025, 1, 1)
        const f = completedTarget(covered)
        ok(f.store.recordObservations([{ source: "github", identity: "acme/widget", remoteAt: covered + 1 }], t0 + DAY))
        const results = yield* Effect.all(
          Array.from({ length: 8 }, () => f.store.promote("github", rule(10, 0), t0 + 2 * DAY)),
          { concurrency: "unbounded" }
        )
        expect(results.flatMap((r) => r.promoted)).toEqual(["acme/widget"])
        // The same race on the pure rule: each cycle read one snapshot, and the write is a compare-and-set on (status, fence).
        const snapshot = Target.observe({ ...f.get(), status: "completed", fence: 4 }, { source: "github", identity: "acme/widget", remoteAt: covered + 2 })
        let row = snapshot
        let wins = 0
        for (let cycle = 0; cycle < 8; cycle++) {
          const [chosen] = Promotion.select([snapshot], rule(1, 0), t0 + 2 * DAY).promote
          if (chosen && row.status === chosen.status && row.fence === chosen.fence) {
            row = Promotion.promote(row)
            wins++
          }
        }
        expect(wins).toBe(1)
        expect(Either.isRight(Claim.claim(row, snapshot.fence + 1, t0 + 2 * DAY))).toBe(true)
      })
    )
  })

  describe("Requirement: Updated discovery remains capable of seeing changed known targets", () => {
    it("Known identities appear on an early page", () => {
      // Ten pages of twenty; the first five hold only known identities, a changed one sits on page seven.
      const limits = { maxPages: 8, maxResults: 1000 }
      const walk = (updatedRescans: boolean) => {
        let pages = 0
        for (;;) {
          pages++
          const step = Discovery.nextStep({ pagesFetched: pages, resultsSeen: pages * 20, pageAllKnown: pages <= 5, hasNext: pages < 10, updatedRescans }, limits)
          if (step._tag === "stop") return { pages, reason: step.reason }
        }
      }
      const on = walk(true)
      expect(on).toEqual({ pages: 8, reason: "page_limit" })
      expect(on.pages).toBeGreaterThanOrEqual(7)
      // Identity-only stopping would have ended at the first page.
      expect(walk(false)).toEqual({ pages: 1, reason: "known_page" })
    })

    it("HuggingFace Space was created long ago and recently updated", () => {
      const now = t0
      const space = { id: "acme/old-space", createdAt: "2021-03-01T00:00:00.000Z", lastModified: iso(now - HOUR) }
      expect(RemoteTimestamp.fieldOf.huggingface).toBe("lastModified")
      const remoteAt = RemoteTimestamp.fromRecord("huggingface", space, now)
      expect(remoteAt).toBe(now - HOUR)
      const f = fleet()
      ok(f.store.recordObservations([{ source: "huggingface", identity: space.id, remoteAt: Date.UTC(2021, 2, 1) }], Date.UTC(2021, 2, 2)))
      f.finish(f.claim(Date.UTC(2021, 2, 2))!, Date.UTC(2021, 2, 2) + 10 * MIN)
      ok(f.store.recordObservations([{ source: "huggingface", identity: space.id, remoteAt: remoteAt ?? null }], now))
      expect(ok(f.store.promote("huggingface", rule(), now)).promoted).toEqual([space.id])
    })
  })

  describe("Requirement: Claims record the covered remote revision", () => {
    it("Revision-aware target is claimed", () => {
      const f = fleet()
      const r = Date.UTC(2025, 1, 10)
      for (const remoteAt of [r - DAY, r, null, r - 2 * DAY])
        ok(f.store.recordObservations([{ source: "gitlab", identity: "acme/tool", remoteAt }], t0))
      const a = f.claim(t0 + 1)!
      expect(a.coveredRemoteAt).toBe(r)
      expect(ok(f.store.getTarget("gitlab", "acme/tool")).coveredRemoteAt).toBe(r)
    })

    it("Claim fails before authority is committed", () => {
      const f = fleet(1)
      ok(f.store.recordObservations([{ source: "github", identity: "one", remoteAt: t0 - DAY }, { source: "github", identity: "two", remoteAt: t0 - HOUR }], t0))
      f.claim(t0)
      const before = ok(f.store.getTarget("github", "two"))
      // Capacity: the device's only slot is taken.
      const full = attempt(f.store.claim({ deviceId: f.device.id, slot: 0, now: t0 + 1, config: Config.defaults }))
      expect(Either.isLeft(full) && full.left.reason).toBe("slot_busy")
      const outside = attempt(f.store.claim({ deviceId: f.device.id, slot: 1, now: t0 + 1, config: Config.defaults }))
      expect(Either.isLeft(outside) && outside.left.reason).toBe("capacity")
      expect(ok(f.store.getTarget("github", "two"))).toEqual(before)
      expect(before.coveredRemoteAt).toBeNull()
      // Fencing: a claim made against a fence that has moved is refused and changes nothing.
      const r = Claim.claim(before, before.fence + 1, t0 + 1)
      expect(Either.isLeft(r) && r.left.reason).toBe("fence")
      expect(before.coveredRemoteAt).toBeNull()
    })
  })

  describe("Requirement: Updated-target activity is separately observable", () => {
    it("Cycle admits new and updated targets", () => {
      const covered = Date.UTC(2025, 1, 1)
      const f = completedTarget(covered, "acme/changed")
      const now = t0 + 2 * DAY
      const recorded = ok(
        f.store.recordObservations(
          [
            { source: "github", identity: "acme/changed", remoteAt: covered + DAY },
            { source: "github", identity: "acme/new-1", remoteAt: covered + DAY },
            { source: "github", identity: "acme/new-2", remoteAt: null }
          ],
          now
        )
      )
      const promoted = ok(f.store.promote("github", rule(), now))
      const counts = Discovery.counts(new Set(recorded.inserted), new Set(promoted.promoted))
      expect(counts).toEqual({ queuedNewCount: 2, queuedUpdatedCount: 1 })
      const cycle = ok(
        f.store.recordCycle({ source: "github", startedAt: now, endedAt: now + 1, pages: 1, results: 3, malformed: 0, ...counts, deferredCount: promoted.deferred, stopReason: "end_of_listing", error: null })
      )
      expect(ok(f.store.listCycles({ source: "github", limit: 1 }))).toEqual([cycle])
      expect(cycle.queuedNewCount + cycle.queuedUpdatedCount).toBe(3)
    })

    it("No changed targets are promoted", () => {
      const covered = Date.UTC(2025, 1, 1)
      const f = completedTarget(covered)
      const now = t0 + 2 * DAY
      const recorded = ok(f.store.recordObservations([{ source: "github", identity: "acme/widget", remoteAt: covered }], now))
      const promoted = ok(f.store.promote("github", rule(), now))
      expect(Discovery.counts(new Set(recorded.inserted), new Set(promoted.promoted))).toEqual({ queuedNewCount: 0, queuedUpdatedCount: 0 })
    })
  })
})
