import { describe, expect, it } from "@effect/vitest"
import { Either, FastCheck as fc } from "effect"
import { Config, Deadline, Source } from "@scanfleet/core"
import { T0 } from "./fixtures/arbitraries.js"

const secs = (max: number) => fc.integer({ min: 1, max })

const sourcePolicy = fc.record({
  scanTimeoutSeconds: secs(5000),
  uploadTimeoutSeconds: secs(2000),
  cooldownSeconds: fc.integer({ min: 0, max: 86_400 }),
  promotionBudget: fc.integer({ min: 0, max: 500 }),
  updatedRescans: fc.boolean()
})

/** Well-shaped configuration documents; some break the deadline rule, some do not. */
const config: fc.Arbitrary<Config.ManagedConfig> = fc.record({
  version: fc.constant(1 as const),
  assignments: fc.record({
    globalTtlSeconds: secs(10_000),
    handoffMarginSeconds: fc.integer({ min: 0, max: 600 }),
    overrides: fc.record(
      { gitlab: fc.record({ ttlSeconds: secs(10_000) }), dockerhub: fc.record({ ttlSeconds: secs(10_000) }), huggingface: fc.record({ ttlSeconds: secs(10_000) }) },
      { requiredKeys: [] }
    )
  }),
  sources: fc.record({ github: sourcePolicy, gitlab: sourcePolicy, huggingface: sourcePolicy, dockerhub: sourcePolicy }),
  expiry: fc.record({ maxAttempts: fc.integer({ min: 1, max: 100 }) }),
  metrics: fc.record({ minSamples: fc.integer({ min: 1, max: 1000 }) })
})

/** Every leaf path of a JSON value. */
const leaves = (v: unknown, path: ReadonlyArray<string> = []): Array<ReadonlyArray<string>> =>
  v !== null && typeof v === "object" ? Object.entries(v).flatMap(([k, x]) => leaves(x, [...path, k])) : [path]

const setAt = (v: unknown, path: ReadonlyArray<string>, value: unknown): unknown => {
  if (path.length === 0) return value
  const o = v as Record<string, unknown>
  return { ...o, [path[0]]: setAt(o[path[0]], path.slice(1), value) }
}

const now = T0

describe("Config and Deadline", () => {
  it.prop("a policy that validates yields expiry ≥ upload deadline + margin for every source", [config, fc.integer({ min: 0, max: 4e12 })], ([c, at]) => {
    const r = Config.preview(c)
    const broken = Source.sources.filter((s) => {
      const { deadlines, policy } = Deadline.issueFor(c, s, at)
      return deadlines.expiresAt < deadlines.uploadDeadline + policy.handoffMarginSeconds * 1000
    })
    if (Either.isRight(r)) {
      expect(broken).toEqual([])
    } else {
      // A refusal names exactly the sources whose expiry cannot cover, each by its TTL field.
      expect(r.left.map((v) => v.message.split(":")[0])).toEqual(broken)
      for (const v of r.left) expect(v.path).toEqual(Config.ttlPath(Config.effectivePolicy(c, v.message.split(":")[0] as Source.Source)))
    }
  })

  it.prop("every violation names its field path", [config, fc.nat(), fc.oneof(fc.string(), fc.constant(-1), fc.constant(1.5), fc.constant(null), fc.boolean(), fc.constant({}))], ([c, pick, bad]) => {
    const paths = leaves(c)
    const path = paths[pick % paths.length]
    const mutated = setAt(c, path, bad)
    const r = Config.preview(mutated)
    const stillValid = Config.ManagedConfigSchema.safeParse(mutated).success
    if (stillValid) return
    expect(Either.isLeft(r)).toBe(true)
    const violations = Either.isLeft(r) ? r.left : []
    for (const v of violations) {
      expect(v.path.length).toBeGreaterThan(0)
      expect(v.message.length).toBeGreaterThan(0)
    }
    expect(violations.map((v) => v.path.join("."))).toContain(path.join("."))
  })

  it.prop("an unknown field is refused at its own path", [config, fc.constantFrom<ReadonlyArray<string>>([], ["assignments"], ["sources", "gitlab"], ["assignments", "overrides"]), fc.constantFrom("ttl", "extra", "scanTimeout")], ([c, at, key]) => {
    const withExtra = setAt(c, [...at, key], 5)
    const r = Config.preview(withExtra)
    expect(Either.isLeft(r) && r.left.map((v) => v.path.join("."))).toContain([...at, key].join("."))
  })

  it.prop("the effective policy uses the source's override exactly when one is configured", [config, fc.constantFrom(...Source.sources)], ([c, s]) => {
    const p = Config.effectivePolicy(c, s)
    const o = s === "github" ? undefined : c.assignments.overrides[s]
    expect(p.origin).toBe(o ? "override" : "global")
    expect(p.ttlSeconds).toBe(o ? o.ttlSeconds : c.assignments.globalTtlSeconds)
    expect(p.scanTimeoutSeconds).toBe(c.sources[s].scanTimeoutSeconds)
    expect(p.uploadTimeoutSeconds).toBe(c.sources[s].uploadTimeoutSeconds)
  })

  it.prop("the three deadlines are fixed at issuance: scan, then upload after it, expiry by the TTL", [config, fc.constantFrom(...Source.sources), fc.integer({ min: 0, max: 4e12 })], ([c, s, at]) => {
    const { policy, deadlines: d } = Deadline.issueFor(c, s, at)
    expect(d.issuedAt).toBe(at)
    expect(d.scanDeadline).toBe(at + policy.scanTimeoutSeconds * 1000)
    expect(d.uploadDeadline).toBe(d.scanDeadline + policy.uploadTimeoutSeconds * 1000)
    expect(d.expiresAt).toBe(at + policy.ttlSeconds * 1000)
    expect(d.scanDeadline).toBeGreaterThan(at)
    expect(d.uploadDeadline).toBeGreaterThan(d.scanDeadline)
  })

  it.prop("the next deadline named is the earliest one still ahead, by its meaning", [config, fc.constantFrom(...Source.sources), fc.integer({ min: -10, max: 30_000 })], ([c, s, dt]) => {
    const { deadlines: d } = Deadline.issueFor(c, s, now)
    const at = now + dt * 1000
    const n = Deadline.next(d, at)
    const ahead = (["scanDeadline", "uploadDeadline", "expiresAt"] as const).filter((w) => d[w] > at)
    if (ahead.length === 0) {
      expect(n).toBeNull()
      return
    }
    const earliest = Math.min(...ahead.map((w) => d[w]))
    expect(n!.at).toBe(earliest)
    expect(d[n!.which]).toBe(earliest)
    expect(n!.label).toBe(Deadline.labels[n!.which])
    expect(n!.remainingMs).toBe(earliest - at)
    expect(n!.label).not.toBe("deadline")
  })

  it.prop("previewing any value never throws, and every refusal says where and why", [fc.oneof(fc.anything(), fc.jsonValue(), config.map((c) => ({ ...c, assignments: { ...c.assignments, extra: 1 } })))], ([candidate]) => {
    const r = Config.preview(candidate)
    if (Either.isLeft(r)) {
      expect(r.left.length).toBeGreaterThan(0)
      for (const v of r.left) {
        expect(Array.isArray(v.path)).toBe(true)
        expect(v.message.trim().length).toBeGreaterThan(0)
      }
    }
  })

  it("the defaults validate", () => {
    expect(Config.preview(Config.defaults)).toEqual(Either.right(Config.defaults))
  })
})
