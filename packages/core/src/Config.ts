import { Either } from "effect"
import { z } from "zod"
import { sources, type Source } from "./Source.js"

const seconds = (max: number) => z.number().int().min(1).max(max)
const DAY = 86_400

/**
 * How failed and unresolved targets of a source are retried at one covered revision: the n-th
 * redrive waits `initialSeconds * 2^n` (at most `maxSeconds`) after the failure, and after
 * `maxRedrives` redrives the target waits for a newer revision or an operator's requeue.
 * A source without it uses `Retry.defaultBackoff`.
 */
export const FailureBackoffSchema = z
  .object({
    initialSeconds: seconds(7 * DAY),
    maxSeconds: seconds(30 * DAY),
    maxRedrives: z.number().int().min(0).max(1000)
  })
  .strict()
  .refine((b) => b.maxSeconds >= b.initialSeconds, { message: "maxSeconds must be at least initialSeconds", path: ["maxSeconds"] })

/** Per-source settings of the managed configuration. */
export const SourcePolicySchema = z
  .object({
    /** The target-scan timeout: one hard limit over the whole scan stage. */
    scanTimeoutSeconds: seconds(7 * DAY),
    /** The result-upload timeout, counted from the target-scan deadline. */
    uploadTimeoutSeconds: seconds(DAY),
    /** Minimum time since a target's last scan before it may be promoted again. */
    cooldownSeconds: z.number().int().min(0).max(365 * DAY),
    /** Hard maximum of updated-target promotions per discovery cycle. */
    promotionBudget: z.number().int().min(0).max(1_000_000),
    /** Whether changed completed targets are rescanned at all. */
    updatedRescans: z.boolean(),
    /** Backoff of failed and unresolved targets (default `Retry.defaultBackoff`). */
    failureBackoff: FailureBackoffSchema.optional()
  })
  .strict()

const TtlOverride = z.object({ ttlSeconds: seconds(14 * DAY) }).strict()

/** The managed runtime configuration document (v1). */
export const ManagedConfigSchema = z
  .object({
    version: z.literal(1),
    assignments: z
      .object({
        /** End-to-end assignment TTL used by every source without an override. */
        globalTtlSeconds: seconds(14 * DAY),
        /** Slack between the result-upload deadline and the assignment expiry. */
        handoffMarginSeconds: z.number().int().min(0).max(DAY),
        overrides: z
          .object({ gitlab: TtlOverride.optional(), dockerhub: TtlOverride.optional(), huggingface: TtlOverride.optional() })
          .strict()
      })
      .strict(),
    sources: z
      .object({ github: SourcePolicySchema, gitlab: SourcePolicySchema, huggingface: SourcePolicySchema, dockerhub: SourcePolicySchema })
      .strict(),
    expiry: z.object({ maxAttempts: z.number().int().min(1).max(100) }).strict(),
    metrics: z.object({ minSamples: z.number().int().min(1).max(1_000_000) }).strict()
  })
  .strict()

/** The managed runtime configuration document. */
export type ManagedConfig = z.infer<typeof ManagedConfigSchema>
/** A source's failure backoff. */
export type FailureBackoff = z.infer<typeof FailureBackoffSchema>
/** Per-source settings. */
export type SourcePolicy = z.infer<typeof SourcePolicySchema>

/** The configuration a fresh fleet starts with. */
export const defaults: ManagedConfig = {
  version: 1,
  assignments: { globalTtlSeconds: 3600, handoffMarginSeconds: 60, overrides: {} },
  sources: {
    github: { scanTimeoutSeconds: 1800, uploadTimeoutSeconds: 300, cooldownSeconds: 86_400, promotionBudget: 100, updatedRescans: true },
    gitlab: { scanTimeoutSeconds: 1800, uploadTimeoutSeconds: 300, cooldownSeconds: 86_400, promotionBudget: 100, updatedRescans: true },
    huggingface: { scanTimeoutSeconds: 2700, uploadTimeoutSeconds: 300, cooldownSeconds: 86_400, promotionBudget: 100, updatedRescans: true },
    dockerhub: { scanTimeoutSeconds: 2700, uploadTimeoutSeconds: 600, cooldownSeconds: 86_400, promotionBudget: 0, updatedRescans: false }
  },
  expiry: { maxAttempts: 3 },
  metrics: { minSamples: 20 }
}

/** One reason a configuration is refused, at a field path, in words a person can act on. */
export interface Violation {
  readonly path: ReadonlyArray<string | number>
  readonly message: string
}

/** Where a source's effective assignment TTL comes from. */
export type Origin = "override" | "global"

/** A source's effective assignment policy, with its origin. */
export interface EffectivePolicy {
  readonly source: Source
  readonly origin: Origin
  readonly ttlSeconds: number
  readonly scanTimeoutSeconds: number
  readonly uploadTimeoutSeconds: number
  readonly handoffMarginSeconds: number
}

/** Resolves the effective policy of a source: its override where one exists, else the global TTL. */
export const effectivePolicy = (c: ManagedConfig, source: Source): EffectivePolicy => {
  const o = source === "github" ? undefined : c.assignments.overrides[source]
  const s = c.sources[source]
  return {
    source,
    origin: o ? "override" : "global",
    ttlSeconds: o ? o.ttlSeconds : c.assignments.globalTtlSeconds,
    scanTimeoutSeconds: s.scanTimeoutSeconds,
    uploadTimeoutSeconds: s.uploadTimeoutSeconds,
    handoffMarginSeconds: c.assignments.handoffMarginSeconds
  }
}

/** The path of the field that sets a source's effective TTL. */
export const ttlPath = (p: EffectivePolicy): ReadonlyArray<string> =>
  p.origin === "override" ? ["assignments", "overrides", p.source, "ttlSeconds"] : ["assignments", "globalTtlSeconds"]

/** Checks that every source's effective TTL covers scan timeout + upload timeout + handoff margin. */
export const checkDeadlines = (c: ManagedConfig): ReadonlyArray<Violation> =>
  sources.flatMap((source) => {
    const p = effectivePolicy(c, source)
    const need = p.scanTimeoutSeconds + p.uploadTimeoutSeconds + p.handoffMarginSeconds
    if (p.ttlSeconds >= need) return []
    const path = ttlPath(p)
    return [
      {
        path,
        message:
          `${source}: the assignment expiry (${path.join(".")} = ${p.ttlSeconds} s, ${p.origin}) must cover ` +
          `the scan timeout (sources.${source}.scanTimeoutSeconds = ${p.scanTimeoutSeconds} s) + the upload timeout ` +
          `(sources.${source}.uploadTimeoutSeconds = ${p.uploadTimeoutSeconds} s) + the handoff margin ` +
          `(assignments.handoffMarginSeconds = ${p.handoffMarginSeconds} s) = ${need} s; ` +
          `raise ${path.join(".")} to at least ${need} or lower one of the others`
      }
    ]
  })

// zod reports unknown keys once, at the enclosing object; a person fixes them one
// field at a time, so each becomes a violation at its own path.
const toViolations = (i: z.core.$ZodIssue): ReadonlyArray<Violation> => {
  const path = i.path.map((k) => (typeof k === "symbol" ? String(k) : k))
  if (i.code === "unrecognized_keys")
    return i.keys.map((k) => ({ path: [...path, k], message: `unknown field "${k}": remove it or check its spelling` }))
  return [{ path, message: i.message }]
}

/**
 * Validates a candidate document as a whole: shape first (every zod issue with
 * its path), then the deadline rule. Writes nothing; this is the preview.
 *
 * @example
 * const r = preview(JSON.parse(text))
 * if (Either.isLeft(r)) for (const v of r.left) console.log(v.path.join("."), v.message)
 */
export const preview = (candidate: unknown): Either.Either<ManagedConfig, ReadonlyArray<Violation>> => {
  const parsed = ManagedConfigSchema.safeParse(candidate)
  if (!parsed.success) return Either.left(parsed.error.issues.flatMap(toViolations))
  const violations = checkDeadlines(parsed.data)
  return violations.length > 0 ? Either.left(violations) : Either.right(parsed.data)
}
