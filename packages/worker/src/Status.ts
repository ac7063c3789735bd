import { Deadline } from "@scanfleet/core"
import { Effect } from "effect"
import * as Containment from "./Containment.js"
import type * as LocalState from "./LocalState.js"

/**
 * What `scanfleet-worker status` says about a state file: the containment
 * level in force, the fleets its journal holds, each slot and its
 * assignment with the three labelled deadlines, and what is still being
 * delivered. `read` gathers it as data; `render` prints it.
 */

/** One labelled deadline of an assignment, on the device's clock. */
export interface DeadlineRow {
  readonly which: "scanDeadline" | "uploadDeadline" | "expiresAt"
  readonly label: string
  readonly at: number
  readonly remainingMs: number
}

/** One assignment as status shows it. */
export interface AssignmentLine {
  readonly fleetId: string
  readonly reservationId: number
  readonly slot: number
  readonly target: string
  readonly status: LocalState.AssignmentRecord["status"]
  readonly phase: LocalState.AssignmentRecord["phase"]
  readonly lastSeq: number
  readonly outcome: LocalState.AssignmentRecord["outcome"]
  readonly deadlines: ReadonlyArray<DeadlineRow>
  /** The deadline that fires next, or null when all three have passed. */
  readonly next: { readonly label: string; readonly remainingMs: number } | null
}

/** The whole status report. */
export interface Report {
  readonly containment: {
    readonly level: Containment.Level
    /** `recorded`: what the last controller on this file started with; `detected`: what this device would use now (no controller ran yet). */
    readonly source: "recorded" | "detected"
    readonly guarantee: string
    readonly detail: string | null
  }
  readonly controller: LocalState.ControllerInfo | null
  readonly fleets: ReadonlyArray<LocalState.FleetSummary>
  readonly slots: ReadonlyArray<{ readonly slot: number; readonly assignment: AssignmentLine | null }>
  /** Assignments whose slot is free again and whose result is still on its way. */
  readonly delivering: ReadonlyArray<AssignmentLine>
}

/** The three deadlines of an assignment by meaning, with the time left at `now`, and which fires next. */
export const deadlines = (a: LocalState.AssignmentRecord, now: number): Pick<AssignmentLine, "deadlines" | "next"> => {
  const d = { issuedAt: a.view.issuedAt + a.clockOffsetMs, scanDeadline: a.deadlines.scan, uploadDeadline: a.deadlines.upload, expiresAt: a.deadlines.expiry }
  const next = Deadline.next(d, now)
  return {
    deadlines: (["scanDeadline", "uploadDeadline", "expiresAt"] as const).map((w) => ({ which: w, label: Deadline.labels[w], at: d[w], remainingMs: d[w] - now })),
    next: next ? { label: next.label, remainingMs: next.remainingMs } : null
  }
}

/** One assignment's status line. */
export const line = (a: LocalState.AssignmentRecord, now: number): AssignmentLine => ({
  fleetId: a.fleetId,
  reservationId: a.reservationId,
  slot: a.slot,
  target: `${a.view.target.source}:${a.view.target.identity}`,
  status: a.status,
  phase: a.phase,
  lastSeq: a.lastSeq,
  outcome: a.outcome,
  ...deadlines(a, now)
})

/**
 * Reads the status of a state file at `now`.
 *
 * @example
 * const state = await LocalState.open("./worker.db")
 * const report = await Status.read(state, Date.now())
 */
export const read = async (state: LocalState.LocalState, now: number): Promise<Report> => {
  const [slots, open, fleets, controller] = await Promise.all([state.slots(), state.assignments({ open: true }), state.fleets(), state.controller()])
  const level = controller !== null ? Containment.LevelSchema.safeParse(controller.containment) : null
  const plan = level?.success ? null : await Effect.runPromise(Effect.either(Containment.detect()))
  const containment: Report["containment"] = level?.success
    ? { level: level.data, source: "recorded", guarantee: Containment.guarantees[level.data], detail: null }
    : plan !== null && plan._tag === "Right"
      ? { level: plan.right.level, source: "detected", guarantee: Containment.guarantees[plan.right.level], detail: plan.right.detail }
      : { level: "freeze-kill", source: "detected", guarantee: Containment.guarantees["freeze-kill"], detail: plan !== null && plan._tag === "Left" ? plan.left.message : null }
  const inSlot = (s: LocalState.SlotState) =>
    s.reservationId === null ? undefined : open.find((a) => a.reservationId === s.reservationId && (s.fleetId === null || a.fleetId === s.fleetId))
  return {
    containment,
    controller,
    fleets,
    slots: slots.map((s) => {
      const a = inSlot(s)
      return { slot: s.slot, assignment: a ? line(a, now) : null }
    }),
    delivering: open.filter((a) => a.status === "delivering").map((a) => line(a, now))
  }
}

const duration = (ms: number): string => {
  const abs = Math.abs(ms)
  const text = abs < 1000 ? `${abs} ms` : abs < 120_000 ? `${(abs / 1000).toFixed(1)} s` : abs < 7_200_000 ? `${Math.round(abs / 60_000)} min` : `${(abs / 3_600_000).toFixed(1)} h`
  return ms >= 0 ? `in ${text}` : `passed ${text} ago`
}

/** An assignment's detail lines: phase, the three deadlines and which fires next. */
export const describe = (a: AssignmentLine): Array<string> => {
  const lines = [`  current phase: ${a.phase ?? "none"} (last sequence ${a.lastSeq})${a.outcome ? `, outcome ${a.outcome}` : ""}`]
  for (const r of a.deadlines) lines.push(`  ${r.label.padEnd(24)} ${new Date(r.at).toISOString()}  ${duration(r.remainingMs)}`)
  if (a.status !== "done") lines.push(`  fires next: ${a.next ? `${a.next.label} ${duration(a.next.remainingMs)}` : "nothing (all three have passed)"}`)
  return lines
}

/** Prints a report as `scanfleet-worker status` does. */
export const render = (r: Report): string => {
  const out: Array<string> = []
  const c = r.containment
  out.push(`containment: ${c.level} (${c.source === "recorded" ? `in force for the controller started ${r.controller ? new Date(r.controller.startedAt).toISOString() : "?"}` : "detected now; no controller has run on this file"})`)
  out.push(`  ${c.guarantee}`)
  if (c.detail) out.push(`  ${c.detail}`)
  if (r.fleets.length === 0) out.push("fleets: none yet (the journal is empty)")
  else {
    out.push(`fleets in the journal: ${r.fleets.length}`)
    r.fleets.forEach((f, i) =>
      out.push(
        `  fleet ${f.fleetId}${f.server ? ` via ${f.server}` : ""}: ${f.assignments} assignment(s), ${f.open} open, ${f.undelivered} undelivered` +
          (i === 0 && f.lastSeenAt !== null ? " (reached most recently)" : "")
      )
    )
  }
  for (const s of r.slots) {
    if (!s.assignment) {
      out.push(`slot ${s.slot}: idle`)
      continue
    }
    out.push(`slot ${s.slot}: reservation ${s.assignment.reservationId} ${s.assignment.target} (fleet ${s.assignment.fleetId})`)
    out.push(...describe(s.assignment))
  }
  if (r.delivering.length > 0) out.push("", "delivering (slot already free):")
  for (const a of r.delivering) {
    out.push(`reservation ${a.reservationId} ${a.target} (slot ${a.slot}, fleet ${a.fleetId})`)
    out.push(...describe(a))
  }
  return out.join("\n")
}
