import type { EffectivePolicy, ManagedConfig } from "./Config.js"
import { effectivePolicy } from "./Config.js"
import type { Source } from "./Source.js"

/** The three immutable deadlines fixed at issuance, epoch milliseconds (server clock). */
export interface Deadlines {
  readonly issuedAt: number
  /** Target-scan deadline: the whole scan stage must end by then. */
  readonly scanDeadline: number
  /** Result-upload deadline: the result must be accepted by then. */
  readonly uploadDeadline: number
  /** Assignment expiry (end to end): after it the server reclaims the target. */
  readonly expiresAt: number
}

/** The labels every view uses; none of them is ever called "the deadline". */
export const labels = {
  scanDeadline: "target-scan deadline",
  uploadDeadline: "result-upload deadline",
  expiresAt: "assignment expiry"
} as const

/** Which deadline a label names. */
export type Which = keyof typeof labels

/**
 * Computes the deadlines of an assignment issued at `now` under a policy.
 *
 * @example
 * issue(effectivePolicy(config, "dockerhub"), Date.now())
 */
export const issue = (p: EffectivePolicy, now: number): Deadlines => {
  const scanDeadline = now + p.scanTimeoutSeconds * 1000
  return {
    issuedAt: now,
    scanDeadline,
    uploadDeadline: scanDeadline + p.uploadTimeoutSeconds * 1000,
    expiresAt: now + p.ttlSeconds * 1000
  }
}

/** Resolves the policy of a source from the configuration and issues its deadlines. */
export const issueFor = (c: ManagedConfig, source: Source, now: number): { readonly policy: EffectivePolicy; readonly deadlines: Deadlines } => {
  const policy = effectivePolicy(c, source)
  return { policy, deadlines: issue(policy, now) }
}

/** The next deadline to fire after `now`, or none when all have passed. */
export const next = (d: Deadlines, now: number): { readonly which: Which; readonly label: string; readonly at: number; readonly remainingMs: number } | null => {
  const order: ReadonlyArray<Which> = (["scanDeadline", "uploadDeadline", "expiresAt"] as const)
    .slice()
    .sort((a, b) => d[a] - d[b])
  for (const which of order) if (d[which] > now) return { which, label: labels[which], at: d[which], remainingMs: d[which] - now }
  return null
}
