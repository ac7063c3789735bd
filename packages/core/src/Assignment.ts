import { z } from "zod"
import type { EffectivePolicy } from "./Config.js"
import type { Deadlines } from "./Deadline.js"
import * as PhaseModel from "./PhaseModel.js"
import type { Metric } from "./Percentile.js"
import type { Source } from "./Source.js"
import type { Target } from "./Target.js"

/** Typed scanner outcomes. `killed_at_deadline` names the phase that was running. */
export const outcomes = ["clean", "findings", "scan_error", "unsupported", "usage", "killed_at_deadline"] as const
/** One scanner outcome. */
export type Outcome = (typeof outcomes)[number]
/** zod schema of an outcome. */
export const OutcomeSchema = z.enum(outcomes)

/** Where a reservation stands. */
export const states = ["active", "completed", "failed", "expired", "released"] as const
/** A reservation's state. */
export type State = (typeof states)[number]

/** What the server kept when an assignment expired: the last thing it heard. */
export interface ExpiryEvidence {
  readonly lastPhase: PhaseModel.Phase | null
  readonly lastProgressAt: number | null
  readonly expiredAt: number
}

/** One reservation of one target for one device slot. */
export interface Assignment extends Deadlines {
  readonly reservationId: number
  readonly targetId: number
  readonly source: Source
  readonly identity: string
  readonly deviceId: number
  readonly slot: number
  /** The target's fence at claim; every worker write carries it. */
  readonly fence: number
  readonly policy: EffectivePolicy
  /** The remote time this scan covers (snapshot at claim). */
  readonly coveredRemoteAt: number | null
  readonly state: State
  readonly lastPhase: PhaseModel.Phase | null
  readonly lastSeq: number
  /** Server time of the last accepted progress event. */
  readonly lastProgressAt: number | null
  readonly outcome: Outcome | null
  /** The phase the worker named as final in its result (timeouts name where they fired). */
  readonly finalPhase: PhaseModel.Phase | null
  readonly endedAt: number | null
  readonly expiry: ExpiryEvidence | null
}

/**
 * A fresh reservation of a just-claimed target (its fence and covered snapshot
 * already taken), with the deadlines and policy fixed at issuance.
 */
export const issued = (
  t: Target,
  holder: { readonly reservationId: number; readonly deviceId: number; readonly slot: number },
  policy: EffectivePolicy,
  deadlines: Deadlines
): Assignment => ({
  // Field by field, in the order spreads would give: spreads into a literal are far slower in
  // V8, and every claim builds one.
  issuedAt: deadlines.issuedAt,
  scanDeadline: deadlines.scanDeadline,
  uploadDeadline: deadlines.uploadDeadline,
  expiresAt: deadlines.expiresAt,
  reservationId: holder.reservationId,
  deviceId: holder.deviceId,
  slot: holder.slot,
  targetId: t.id,
  source: t.source,
  identity: t.identity,
  fence: t.fence,
  policy,
  coveredRemoteAt: t.coveredRemoteAt,
  state: "active",
  lastPhase: null,
  lastSeq: 0,
  lastProgressAt: null,
  outcome: null,
  finalPhase: null,
  endedAt: null,
  expiry: null
})

/** The server's acknowledgement that a result was accepted. */
export interface Receipt {
  readonly receiptId: string
  readonly reservationId: number
  readonly outcome: Outcome
  readonly acceptedAt: number
}

/** One duration observation for the percentile store. */
export interface Duration {
  readonly source: Source
  readonly metric: Metric
  readonly outcome: Outcome
  readonly ms: number
  /** When the assignment ended, server clock. */
  readonly at: number
}

const phaseMetric: Partial<Record<PhaseModel.Phase, Metric>> = { scanning: "scanning", cleanup: "cleanup", bundling: "bundling" }

/**
 * The durations an assignment contributes when its result is accepted. Phase
 * metrics come from the device's timeline (one clock) and only from phases that
 * were left by advancing; `upload` runs from entering `uploading` to acceptance
 * and `end_to_end` from issuance to acceptance, both on the server's clock.
 */
export const durationsOf = (
  a: Pick<Assignment, "source" | "issuedAt">,
  events: ReadonlyArray<PhaseModel.Event>,
  outcome: Outcome,
  acceptedAt: number,
  uploadStartedAt: number | null
): ReadonlyArray<Duration> => {
  const out: Array<Duration> = [{ source: a.source, metric: "end_to_end", outcome, ms: Math.max(0, acceptedAt - a.issuedAt), at: acceptedAt }]
  for (const s of PhaseModel.spans(events)) {
    const metric = phaseMetric[s.phase]
    if (metric && s.leftBy === "advance" && s.end !== null) out.push({ source: a.source, metric, outcome, ms: Math.max(0, s.end - s.start), at: acceptedAt })
  }
  if (uploadStartedAt !== null) out.push({ source: a.source, metric: "upload", outcome, ms: Math.max(0, acceptedAt - uploadStartedAt), at: acceptedAt })
  return out
}

/** The target status a result outcome leads to. */
export const targetStatusAfter = (o: Outcome): "completed" | "failed" | "unresolved" =>
  o === "clean" || o === "findings" ? "completed" : o === "unsupported" ? "unresolved" : "failed"
