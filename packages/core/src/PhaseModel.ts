import { Either } from "effect"
import { z } from "zod"

/** The phase model's version; events and persisted state carry it. */
export const version = 1 as const

/** Phases of the scan stage, in order; one hard deadline spans all of them. */
export const scanStage = ["permit_wait", "preparing", "acquiring", "scanning", "filtering", "cleanup", "staging"] as const
/** Phases of the upload stage, in order, bounded by the result-upload deadline. */
export const uploadStage = ["bundling", "uploading", "awaiting_receipt"] as const
/** Terminal outcomes of an assignment's timeline. */
export const terminal = ["completed", "timed_out", "failed"] as const

/** Every phase, in order: `assigned`, the scan stage, the upload stage, the terminals. */
export const phases = ["assigned", ...scanStage, ...uploadStage, ...terminal] as const

/** One phase of the v1 model. */
export type Phase = (typeof phases)[number]
/** A terminal phase. */
export type Terminal = (typeof terminal)[number]

/** zod schema of a phase name. */
export const PhaseSchema = z.enum(phases)

const rank = new Map<Phase, number>(phases.map((p, i) => [p, i]))

/** True for `completed`, `timed_out` and `failed`. */
export const isTerminal = (p: Phase): p is Terminal => (terminal as ReadonlyArray<string>).includes(p)
/** True for the phases the scan-stage deadline covers. */
export const isScanStage = (p: Phase): boolean => (scanStage as ReadonlyArray<string>).includes(p)

/**
 * Allowed transitions: forward through the non-terminal phases (a phase may be
 * skipped, never revisited), and from any non-terminal phase to a terminal one.
 * `completed` is reachable only from the upload stage.
 */
export const canTransition = (from: Phase | null, to: Phase): boolean => {
  if (from === null) return to === "assigned"
  if (isTerminal(from)) return false
  if (to === "completed") return (uploadStage as ReadonlyArray<string>).includes(from)
  if (isTerminal(to)) return true
  return rank.get(to)! > rank.get(from)!
}

/**
 * The highest sequence a timeline reaches, so a reservation's timeline is bounded: every
 * phase at most once, the rest `recovered` events.
 */
export const maxSeq = 1_000

/**
 * The last sequence a `recovered` event may take. After it there is room for the longest
 * rest a timeline can have (every phase after `assigned`, then one terminal), so a device
 * that records no recovery past it can always finish.
 */
export const lastRecoverySeq = maxSeq - (phases.length - 1 - terminal.length) - 1

/** One timeline event. `recovered` records a restart and does not change the phase. */
export const EventSchema = z
  .object({
    seq: z.number().int().min(1).max(maxSeq),
    kind: z.enum(["phase", "recovered"]),
    phase: PhaseSchema,
    /** Device clock, epoch milliseconds. */
    at: z.number().int().min(0).max(8_640_000_000_000),
    detail: z.string().max(1000).optional()
  })
  .strict()

/** One timeline event. */
export type Event = z.infer<typeof EventSchema>

/** A reduced timeline: the events in sequence order and where they left off. */
export interface Timeline {
  readonly events: ReadonlyArray<Event>
  readonly phase: Phase | null
  readonly lastSeq: number
}

/** The empty timeline. */
export const empty: Timeline = { events: [], phase: null, lastSeq: 0 }

/** Why an event was refused. */
export interface Refusal {
  readonly reason: "sequence_gap" | "illegal_transition" | "terminal"
  readonly seq: number
  readonly message: string
}

/**
 * Why `e` cannot follow a timeline that left off at `phase` after `lastSeq`, or undefined
 * when it can: its sequence must be exactly the next one, and it must be a legal
 * transition (or a recovery of a timeline that has not ended). `append`'s rule, for
 * callers that keep only where a timeline left off.
 */
export const refuseNext = (phase: Phase | null, lastSeq: number, e: Event): Refusal | undefined => {
  if (e.seq !== lastSeq + 1) return { reason: "sequence_gap", seq: e.seq, message: `event sequence ${e.seq} is not the next one (expected ${lastSeq + 1})` }
  if (phase !== null && isTerminal(phase)) return { reason: "terminal", seq: e.seq, message: `the timeline already ended in ${phase}` }
  if (e.kind === "recovered") {
    if (e.seq > lastRecoverySeq)
      return {
        reason: "illegal_transition",
        seq: e.seq,
        message: `a timeline records recoveries up to sequence ${lastRecoverySeq}, leaving room for its remaining phases`
      }
    if (phase === null || e.phase !== phase)
      return { reason: "illegal_transition", seq: e.seq, message: `a recovered event must name the current phase (${phase ?? "none"}), not ${e.phase}` }
  } else if (!canTransition(phase, e.phase)) {
    return { reason: "illegal_transition", seq: e.seq, message: `cannot move from ${phase ?? "nothing"} to ${e.phase}` }
  }
  return undefined
}

/** Appends one event, under `refuseNext`'s rule. */
export const append = (t: Timeline, e: Event): Either.Either<Timeline, Refusal> => {
  const refused = refuseNext(t.phase, t.lastSeq, e)
  return refused === undefined ? Either.right({ events: [...t.events, e], phase: e.phase, lastSeq: e.seq }) : Either.left(refused)
}

/** Reduces a sequence of events from the empty timeline, stopping at the first refusal. */
export const reduce = (events: Iterable<Event>): Either.Either<Timeline, Refusal> => {
  let t = empty
  for (const e of events) {
    const next = append(t, e)
    if (Either.isLeft(next)) return next
    t = next.right
  }
  return Either.right(t)
}

/** Time spent in one phase: from its entry to the next phase event. */
export interface Span {
  readonly phase: Phase
  readonly start: number
  /** Null while the phase is still current. */
  readonly end: number | null
  /** How the phase was left: to a later phase, to a terminal, or not yet. */
  readonly leftBy: "advance" | "terminal" | "open"
}

/** Reconstructs per-phase spans from a timeline; recovery events do not split a phase. */
export const spans = (events: ReadonlyArray<Event>): ReadonlyArray<Span> => {
  const out: Array<Span> = []
  let cur: { phase: Phase; start: number } | null = null
  for (const e of events) {
    if (e.kind === "recovered") continue
    if (cur !== null) out.push({ phase: cur.phase, start: cur.start, end: e.at, leftBy: isTerminal(e.phase) ? "terminal" : "advance" })
    cur = isTerminal(e.phase) ? null : { phase: e.phase, start: e.at }
  }
  if (cur !== null) out.push({ phase: cur.phase, start: cur.start, end: null, leftBy: "open" })
  return out
}
