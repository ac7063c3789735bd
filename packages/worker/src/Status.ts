import { Deadline } from "@scanfleet/core"
import { Effect } from "effect"
import * as Containment from "./Containment.js"
import type * as LocalState from "./LocalState.js"

/**
 * What `scanfleet-worker status` says about a state file: the containment
 * level in force, what was found damaged and set aside (a whole state file
 * the controller started afresh from, single rows), the fleets its journal
 * holds, each slot and its assignment with the three labelled deadlines, and
 * what is still being delivered. `read` gathers it as data; `render` prints it.
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
  /**
   * The wall clock minus the device clock when the report was read. Deadlines and the controller's start are
   * device-clock times (see `DeviceClock`): each is shown moved by this one amount, so a person reads wall-clock
   * times that keep their distances to each other.
   */
  readonly wallOffsetMs: number
  readonly containment: {
    readonly level: Containment.Level
    /** `recorded`: what the last controller on this file started with; `detected`: what this device would use now (no controller ran yet). */
    readonly source: "recorded" | "detected"
    readonly guarantee: string
    readonly detail: string | null
  }
  readonly controller: LocalState.ControllerInfo | null
  /** The damaged state file this one replaced, if it did. */
  readonly reset: LocalState.Reset | null
  /** Rows set aside as damaged: how many in all, and the newest. */
  readonly damaged: { readonly total: number; readonly rows: ReadonlyArray<LocalState.DamagedRow> }
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
 * Reads the status of a state file at `now` on its device clock; `wallOffsetMs` is the wall clock minus that
 * clock at the same moment (0 where the two agree).
 *
 * @example
 * const state = await LocalState.open("./worker.db")
 * const report = await Status.read(state, Date.now())
 */
export const read = async (state: LocalState.LocalState, now: number, wallOffsetMs = 0): Promise<Report> => {
  const [slots, open, fleets, controller, reset] = await Promise.all([state.slots(), state.assignments({ open: true }), state.fleets(), state.controller(), state.reset()])
  // After the reads above, which set aside what they find damaged.
  const damaged = await state.damagedRows(10)
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
    wallOffsetMs,
    containment,
    controller,
    reset,
    damaged,
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

/** A device-clock time as a person reads it: on the wall clock, `wallOffsetMs` (wall clock minus device clock, read once per view) on. */
export const wallIso = (at: number, wallOffsetMs: number): string => new Date(at + wallOffsetMs).toISOString()

/** An assignment's detail lines: phase, the three deadlines (on the wall clock, see `wallIso`) and which fires next. */
export const describe = (a: AssignmentLine, wallOffsetMs = 0): Array<string> => {
  const lines = [`  current phase: ${a.phase ?? "none"} (last sequence ${a.lastSeq})${a.outcome ? `, outcome ${a.outcome}` : ""}`]
  for (const r of a.deadlines) lines.push(`  ${r.label.padEnd(24)} ${wallIso(r.at, wallOffsetMs)}  ${duration(r.remainingMs)}`)
  if (a.status !== "done") lines.push(`  fires next: ${a.next ? `${a.next.label} ${duration(a.next.remainingMs)}` : "nothing (all three have passed)"}`)
  return lines
}

/** Prints a report as `scanfleet-worker status` does. */
export const render = (r: Report): string => {
  const out: Array<string> = []
  const c = r.containment
  out.push(`containment: ${c.level} (${c.source === "recorded" ? `in force for the controller started ${r.controller ? wallIso(r.controller.startedAt, r.wallOffsetMs) : "?"}` : "detected now; no controller has run on this file"})`)
  out.push(`  ${c.guarantee}`)
  if (c.detail) out.push(`  ${c.detail}`)
  if (r.reset)
    out.push(
      `state file started afresh at ${new Date(r.reset.at).toISOString()}: the previous one was damaged (${r.reset.code}: ${r.reset.problem}) and is kept as ${r.reset.setAsideAs}`,
      `  lost with it: ${r.reset.lost}`
    )
  if (r.damaged.total > 0) {
    out.push(`rows set aside as damaged: ${r.damaged.total} (kept in the state file's damaged_rows table${r.damaged.total > r.damaged.rows.length ? `; the newest ${r.damaged.rows.length} here` : ""})`)
    for (const d of r.damaged.rows) out.push(`  ${new Date(d.at).toISOString()} ${d.table} (${d.key}): ${d.problem}; ${d.lost}`)
  }
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
    out.push(...describe(s.assignment, r.wallOffsetMs))
  }
  if (r.delivering.length > 0) out.push("", "delivering (slot already free):")
  for (const a of r.delivering) {
    out.push(`reservation ${a.reservationId} ${a.target} (slot ${a.slot}, fleet ${a.fleetId})`)
    out.push(...describe(a, r.wallOffsetMs))
  }
  return out.join("\n")
}
