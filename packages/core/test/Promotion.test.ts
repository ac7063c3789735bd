import { describe, expect, it } from "@effect/vitest"
import { Either, FastCheck as fc } from "effect"
import { Claim, Promotion, Target } from "@scanfleet/core"
import { completedTarget, maybeTime, promotableSource, status, target, time, T0 } from "./fixtures/arbitraries.js"

/** The promotion rule restated from the requirement, as the oracle for `decide`. */
const oracle = (t: Target.Target, cooldownMs: number, now: number): boolean => {
  if (t.status !== "completed" || t.source === "dockerhub" || t.observedRemoteAt === null) return false
  const basis = t.coveredRemoteAt !== null ? t.coveredRemoteAt : t.completedAt
  if (basis === null || t.observedRemoteAt <= basis) return false
  const lastScan = t.lastScanStartedAt ?? t.completedAt ?? 0
  return now - lastScan >= cooldownMs
}

const cooldown = fc.integer({ min: 0, max: 15 })
const later = fc.integer({ min: T0, max: T0 + 40 })

describe("Target", () => {
  it.prop("observed_remote_at only moves forward", [target, fc.array(maybeTime, { maxLength: 12 })], ([t0, seen]) => {
    let t = t0
    for (const remoteAt of seen) {
      const next = Target.observe(t, { source: t.source, identity: t.identity, remoteAt })
      if (t.observedRemoteAt !== null) expect(next.observedRemoteAt).toBeGreaterThanOrEqual(t.observedRemoteAt)
      t = next
    }
    const all = [t0.observedRemoteAt, ...seen].filter((x): x is number => x !== null)
    expect(t.observedRemoteAt).toBe(all.length === 0 ? null : Math.max(...all))
  })

  it.prop("recording an observation changes no lifecycle or authority field", [target, maybeTime], ([t, remoteAt]) => {
    const { observedRemoteAt: _a, ...before } = t
    const { observedRemoteAt: _b, ...after } = Target.observe(t, { source: t.source, identity: t.identity, remoteAt })
    expect(after).toEqual(before)
  })
})

describe("Promotion", () => {
  it.prop("a target is promoted exactly when completed, promotable, strictly newer than its coverage and out of cooldown", [target, cooldown, later], ([t, c, now]) => {
    const d = Promotion.decide(t, { cooldownMs: c }, now)
    expect(d._tag === "promote").toBe(oracle(t, c, now))
  })

  it.prop("an older or equal observation never promotes", [completedTarget, time, fc.nat({ max: 20 }), later], ([t0, covered, back, now]) => {
    const t = { ...t0, coveredRemoteAt: covered, observedRemoteAt: covered - back }
    expect(Promotion.decide(t, { cooldownMs: 0 }, now)).toEqual({ _tag: "skip", reason: "not_newer" })
  })

  it.prop("a legacy row without a covered value is compared with its completion time", [completedTarget, time, time, later], ([t0, observed, completedAt, now]) => {
    const t = { ...t0, coveredRemoteAt: null, observedRemoteAt: observed, completedAt, lastScanStartedAt: null }
    expect(Promotion.isEligible(t, { cooldownMs: 0 }, now)).toBe(observed > completedAt && now >= completedAt)
  })

  it.prop("a target that is not completed is never promoted", [target.filter((t) => t.status !== "completed"), later], ([t, now]) => {
    expect(Promotion.decide(t, { cooldownMs: 0 }, now)).toEqual({ _tag: "skip", reason: "not_completed" })
  })

  it.prop("a DockerHub target is never promoted", [completedTarget, later], ([t, now]) => {
    expect(Promotion.decide({ ...t, source: "dockerhub", observedRemoteAt: now, coveredRemoteAt: 0 }, { cooldownMs: 0 }, now)._tag).toBe("skip")
  })

  it.prop(
    "the deferred figure is exact below its limit and equals the limit otherwise, never negative",
    [fc.integer({ min: -5, max: 50 }), fc.oneof(fc.integer({ min: -3, max: 40 }), fc.constant(Number.POSITIVE_INFINITY))],
    ([left, limit]) => {
      const d = Promotion.deferredCount(left, limit)
      expect(d).toBe(left <= 0 ? 0 : limit <= 0 ? 0 : Math.min(left, limit))
      expect(Promotion.deferredCount(left)).toBe(Math.max(0, Math.min(left, Promotion.deferredCountLimit)))
    }
  )

  it.prop("a promotion is an authority change: back to pending with the fence bumped", [completedTarget], ([t]) => {
    const p = Promotion.promote(t)
    expect(p).toEqual({ ...t, status: "pending", fence: t.fence + 1, attempts: 0 })
  })

  it.prop(
    "a selection never exceeds the budget, keeps only eligible targets, and splits them in the documented order",
    [fc.uniqueArray(target, { selector: (t) => t.id, maxLength: 30 }), fc.integer({ min: -2, max: 12 }), cooldown, later],
    ([targets, budget, c, now]) => {
      const sel = Promotion.select(targets, { budget, cooldownMs: c }, now)
      const eligible = targets.filter((t) => oracle(t, c, now))
      expect(sel.promote.length).toBeLessThanOrEqual(Math.max(0, budget))
      expect(sel.promote.length + sel.deferred.length).toBe(eligible.length)
      const chosen = [...sel.promote, ...sel.deferred]
      for (let i = 1; i < chosen.length; i++) {
        const [a, b] = [chosen[i - 1], chosen[i]]
        const la = Promotion.lastScanAt(a), lb = Promotion.lastScanAt(b)
        expect(la < lb || (la === lb && a.id < b.id)).toBe(true)
      }
    }
  )

  it.prop(
    "promotions never exceed the budget, and with a positive budget no eligible target waits forever",
    [
      fc.integer({ min: 1, max: 25 }),
      fc.integer({ min: 1, max: 6 }),
      fc.integer({ min: 0, max: 3 }),
      // Per cycle: which targets receive a newer remote timestamp before the cycle.
      fc.array(fc.array(fc.nat({ max: 24 }), { maxLength: 8 }), { minLength: 1, maxLength: 30 })
    ],
    ([n, budget, cooldownSteps, changes]) => {
      const rule = { budget, cooldownMs: cooldownSteps }
      let now = T0
      let remote = T0
      let targets: Array<Target.Target> = Array.from({ length: n }, (_, i) => ({
        ...Target.admit(i + 1, { source: "github", identity: `r/${i}`, remoteAt: T0 - 100 }, T0 - 1000),
        status: "completed",
        coveredRemoteAt: T0 - 100,
        completedAt: T0 - 1000 + i,
        lastScanStartedAt: T0 - 1000 + i
      }))
      // How many consecutive cycles each target has been eligible without being promoted.
      const waited = new Map<number, number>()
      const bound = Math.ceil(n / budget)
      for (const changed of [...changes, ...Array.from({ length: bound + cooldownSteps + 2 }, () => [])]) {
        now += 1
        remote += 1
        for (const i of changed) if (i < n) targets[i] = Target.observe(targets[i], { source: "github", identity: targets[i].identity, remoteAt: remote })
        const sel = Promotion.select(targets, rule, now)
        expect(sel.promote.length).toBeLessThanOrEqual(budget)
        const promoted = new Set(sel.promote.map((t) => t.id))
        for (const t of sel.deferred) {
          const w = (waited.get(t.id) ?? 0) + 1
          expect(w, `target ${t.id} waited ${w} cycles, more than ceil(${n}/${budget})`).toBeLessThan(bound)
          waited.set(t.id, w)
        }
        // Promoted targets are rescanned before the next cycle: claim, then complete.
        targets = targets.map((t) => {
          if (!promoted.has(t.id)) return Promotion.isEligible(t, rule, now) ? t : (waited.delete(t.id), t)
          waited.delete(t.id)
          const claimed = Claim.claim(Promotion.promote(t), t.fence + 1, now)
          if (Either.isLeft(claimed)) throw new Error("a promoted target must be claimable")
          return Claim.complete(claimed.right, now)
        })
      }
      // With no further changes every target ends covered: nothing eligible is left behind.
      expect(targets.filter((t) => t.observedRemoteAt! > t.coveredRemoteAt!)).toEqual([])
    }
  )

  it.prop(
    "a covered revision is promoted at most once",
    [
      fc.array(
        fc.oneof(
          fc.record({ op: fc.constant("observe" as const), remoteAt: time }),
          fc.record({ op: fc.constant("cycle" as const), racers: fc.integer({ min: 1, max: 3 }) }),
          fc.record({ op: fc.constant("claim" as const) }),
          fc.record({ op: fc.constant("complete" as const) }),
          fc.record({ op: fc.constant("release" as const) }),
          fc.record({ op: fc.constant("fail" as const) })
        ),
        { maxLength: 40 }
      ),
      promotableSource
    ],
    ([ops, source]) => {
      let now = T0
      let t: Target.Target = { ...Target.admit(1, { source, identity: "x", remoteAt: T0 }, T0), status: "completed", coveredRemoteAt: T0 - 1, completedAt: T0 }
      const promotedBases: Array<number> = []
      for (const o of ops) {
        now += 1
        switch (o.op) {
          case "observe":
            t = Target.observe(t, { source, identity: "x", remoteAt: o.remoteAt })
            break
          case "cycle": {
            // Racing cycles each read the same snapshot, then compare-and-set on (status, fence).
            const snapshot = t
            for (let r = 0; r < o.racers; r++) {
              const sel = Promotion.select([snapshot], { budget: 1, cooldownMs: 0 }, now)
              if (sel.promote.length === 1 && t.status === snapshot.status && t.fence === snapshot.fence) {
                promotedBases.push(Promotion.coverageBasis(t)!)
                t = Promotion.promote(t)
              }
            }
            break
          }
          case "claim": {
            const c = Claim.claim(t, t.fence, now)
            if (Either.isRight(c)) t = c.right
            break
          }
          case "complete":
            if (t.status === "in_progress") t = Claim.complete(t, now)
            break
          case "release":
            if (t.status === "in_progress") t = Claim.release(t)
            break
          case "fail":
            if (t.status === "in_progress") t = Claim.fail(t)
            break
        }
      }
      for (let i = 1; i < promotedBases.length; i++) expect(promotedBases[i]).toBeGreaterThan(promotedBases[i - 1])
    }
  )
})

describe("Claim", () => {
  it.prop("a rejected claim leaves covered_remote_at unchanged", [target, fc.nat({ max: 10 }), later], ([t, fence, now]) => {
    const r = Claim.claim(t, fence, now)
    if (Either.isLeft(r)) {
      expect(t.status !== "pending" || t.fence !== fence).toBe(true)
      expect(r.left.reason).toBe(t.status !== "pending" ? "not_pending" : "fence")
    } else {
      expect(t.status === "pending" && t.fence === fence).toBe(true)
    }
  })

  it.prop("a successful claim snapshots the newest observation, bumps the fence and stamps the scan start", [target.map((t) => ({ ...t, status: "pending" as const })), later], ([t, now]) => {
    const r = Claim.claim(t, t.fence, now)
    expect(r).toEqual(Either.right({ ...t, status: "in_progress", coveredRemoteAt: t.observedRemoteAt, fence: t.fence + 1, lastScanStartedAt: now, attempts: t.attempts + 1 }))
  })

  it.prop("a superseded fence never holds authority", [target, fc.nat({ max: 10 })], ([t, fence]) => {
    expect(Claim.holds(t, fence)).toBe(t.status === "in_progress" && t.fence === fence)
    const released = Claim.release(t)
    expect(Claim.holds(released, t.fence)).toBe(false)
    expect(Claim.holds(Claim.expire(t, 3), t.fence)).toBe(false)
  })

  it.prop(
    "completion keeps a newer observation, so exactly one follow-up becomes eligible after cooldown",
    [promotableSource, time, fc.integer({ min: 1, max: 20 }), fc.integer({ min: 0, max: 10 })],
    ([source, claimedRemote, bump, c]) => {
      const rule = { cooldownMs: c }
      let now = T0 + 100
      const pending = Target.admit(1, { source, identity: "x", remoteAt: claimedRemote }, T0)
      let t = Either.getOrThrow(Claim.claim(pending, 0, now))
      expect(t.coveredRemoteAt).toBe(claimedRemote)
      t = Target.observe(t, { source, identity: "x", remoteAt: claimedRemote + bump })
      now += 1
      t = Claim.complete(t, now)
      expect(t.observedRemoteAt).toBe(claimedRemote + bump)
      if (c > 1) expect(Promotion.decide(t, rule, now)).toEqual({ _tag: "skip", reason: "cooldown" })
      now += c
      expect(Promotion.decide(t, rule, now)).toEqual({ _tag: "promote" })
      const promoted = Promotion.promote(t)
      t = Claim.complete(Either.getOrThrow(Claim.claim(promoted, promoted.fence, now)), now + 1)
      expect(Promotion.decide(t, rule, now + 10_000)).toEqual({ _tag: "skip", reason: "not_newer" })
    }
  )

  it.prop("expiry re-queues while attempts remain and fails the target after the last one", [target.map((t) => ({ ...t, status: "in_progress" as const })), fc.integer({ min: 1, max: 6 })], ([t, max]) => {
    const e = Claim.expire(t, max)
    expect(e.status).toBe(t.attempts < max ? "pending" : "failed")
    expect(e.fence).toBe(t.fence + 1)
    expect(e.coveredRemoteAt).toBe(t.coveredRemoteAt)
  })
})

describe("Status", () => {
  it.prop("every status is one of the six lifecycle statuses", [status], ([s]) => {
    expect(Target.StatusSchema.safeParse(s).success).toBe(true)
  })
})
