import { describe, expect, it } from "@effect/vitest"
import { Either, FastCheck as fc } from "effect"
import { Claim, Config, Promotion, Retry, type Target } from "@scanfleet/core"
import { completedTarget, target, T0 } from "./fixtures/arbitraries.js"

const policy = fc.record({
  initialSeconds: fc.integer({ min: 1, max: 600 }),
  maxSeconds: fc.integer({ min: 600, max: 86_400 }),
  maxRedrives: fc.integer({ min: 0, max: 8 })
})

// One full life at one revision: claim, then expire until the target fails.
const expiriesUntilFailed = (t0: Target.Target, maxAttempts: number) => {
  let t = t0
  let claims = 0
  for (;;) {
    t = Either.getOrThrow(Claim.claim(t, t.fence, T0))
    claims++
    t = Claim.expire(t, maxAttempts)
    if (t.status === "failed" || claims > 100) return claims
  }
}

describe("Retry: the expiry budget per revision", () => {
  it.prop(
    "a promotion starts a fresh budget: a promoted target is claimed exactly maxAttempts times before an expiry fails it, however many scans came before",
    [completedTarget, fc.integer({ min: 1, max: 6 }), fc.integer({ min: 0, max: 50 })],
    ([t, maxAttempts, previousClaims]) => {
      const promoted = Promotion.promote({ ...t, attempts: previousClaims })
      expect(promoted.attempts).toBe(0)
      expect(expiriesUntilFailed(promoted, maxAttempts)).toBe(maxAttempts)
    }
  )

  it.prop("a redrive starts a fresh expiry budget as well", [target, fc.constantFrom("failed" as const, "unresolved" as const), fc.integer({ min: 1, max: 6 })], ([t, status, maxAttempts]) => {
    const failed = { ...t, status, attempts: 40 }
    const planned = Retry.plan(failed, Retry.initialState, Retry.defaultBackoff, T0)
    const r = Retry.redrive(failed, planned, "backoff")
    expect(r.target).toMatchObject({ status: "pending", fence: t.fence + 1, attempts: 0 })
    expect(expiriesUntilFailed(r.target, maxAttempts)).toBe(maxAttempts)
  })
})

describe("Retry: the failure backoff", () => {
  it.prop("the delay doubles from initialSeconds and never exceeds maxSeconds", [policy, fc.integer({ min: 0, max: 100 })], ([p, n]) => {
    const d = Retry.delayMs(p, n)
    expect(d).toBeLessThanOrEqual(p.maxSeconds * 1000)
    expect(d).toBe(Math.min(p.maxSeconds, p.initialSeconds * 2 ** n) * 1000)
    expect(Retry.delayMs(p, n + 1)).toBeGreaterThanOrEqual(d)
  })

  it.prop(
    "at one revision a failed target is redriven exactly maxRedrives times, each no sooner than its backoff after the failure",
    [target.map((t) => ({ ...t, source: "dockerhub" as const, observedRemoteAt: null, coveredRemoteAt: null })), policy],
    ([t0, p]) => {
      let t: Target.Target = { ...t0, status: "failed" }
      let s = Retry.initialState
      let redrives = 0
      let now = T0
      for (let i = 0; i < p.maxRedrives + 3; i++) {
        s = Retry.plan(t, s, p, now)
        if (s.retryAt === null) break
        expect(s.retryAt - now).toBe(Retry.delayMs(p, redrives))
        expect(Retry.decide(t, s, s.retryAt - 1)).toBeNull()
        expect(Retry.decide(t, s, s.retryAt)).toBe("backoff")
        const r = Retry.redrive(t, s, "backoff")
        redrives++
        // claimed again at the same revision, and failed again
        t = { ...Either.getOrThrow(Claim.claim(r.target, r.target.fence, s.retryAt)), status: "failed" }
        s = r.state
        now = s.redrives * 1000 + T0 + 10_000_000
      }
      expect(redrives).toBe(p.maxRedrives)
      expect(Retry.decide(t, s, Number.MAX_SAFE_INTEGER)).toBeNull()
    }
  )

  it.prop(
    "a newer observed revision redrives a failed target at once, even with its redrives spent, and the new revision counts from zero",
    [target.filter((t) => t.source !== "dockerhub"), policy, fc.integer({ min: 1, max: 1_000_000 })],
    ([t0, p, ahead]) => {
      const covered = t0.coveredRemoteAt ?? T0
      const t: Target.Target = { ...t0, status: "failed", coveredRemoteAt: covered, observedRemoteAt: covered }
      const spent = Retry.plan(t, { redrives: p.maxRedrives, revision: covered, retryAt: null, plannedFence: null }, p, T0)
      expect(spent.retryAt).toBeNull()
      expect(Retry.decide(t, spent, Number.MAX_SAFE_INTEGER)).toBeNull()
      const newer = { ...t, observedRemoteAt: covered + ahead }
      expect(Retry.decide(newer, spent, T0)).toBe("newer_revision")
      const r = Retry.redrive(newer, spent, "newer_revision")
      const claimed = Either.getOrThrow(Claim.claim(r.target, r.target.fence, T0))
      expect(Retry.redrivesAt(claimed, r.state)).toBe(0)
    }
  )

  it.prop("only failed and unresolved targets are ever redriven, and only once planned at their current fence", [target, policy, fc.integer({ min: T0, max: T0 + 1e9 })], ([t, p, now]) => {
    const s = Retry.plan(t, Retry.initialState, p, T0)
    const d = Retry.decide(t, s, now)
    if (!Retry.isRedrivable(t.status)) expect(d).toBeNull()
    expect(Retry.decide({ ...t, fence: t.fence + 1 }, s, now)).toBeNull()
  })

  it("the managed configuration names a backoff per source, and a source without one uses the default", () => {
    const c = { ...Config.defaults, sources: { ...Config.defaults.sources, gitlab: { ...Config.defaults.sources.gitlab, failureBackoff: { initialSeconds: 60, maxSeconds: 600, maxRedrives: 2 } } } }
    expect(Either.isRight(Config.preview(c))).toBe(true)
    expect(Retry.backoffOf(c, "gitlab")).toEqual({ initialSeconds: 60, maxSeconds: 600, maxRedrives: 2 })
    expect(Retry.backoffOf(c, "github")).toEqual(Retry.defaultBackoff)
    const bad = Config.preview({ ...c, sources: { ...c.sources, gitlab: { ...c.sources.gitlab, failureBackoff: { initialSeconds: 600, maxSeconds: 60, maxRedrives: 2 } } } })
    expect(Either.isLeft(bad) && bad.left.map((v) => v.path.join("."))).toEqual(["sources.gitlab.failureBackoff.maxSeconds"])
  })
})
