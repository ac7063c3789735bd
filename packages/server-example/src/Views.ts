import { type Assignment, Deadline, type Store, type WorkerApi } from "@scanfleet/core"
import type { z } from "zod"

const labelled = (label: string, at: number) => ({ label, at, iso: new Date(at).toISOString() })

const whichName = { scanDeadline: "targetScan", uploadDeadline: "resultUpload", expiresAt: "assignmentExpiry" } as const

/**
 * An assignment as devices and operators see it: the three deadlines, each
 * labelled by its meaning, and which one fires next as of `now`.
 */
export const assignment = (a: Assignment.Assignment, now: number, fleetId: string): WorkerApi.AssignmentView => {
  const next = a.state === "active" ? Deadline.next(a, now) : null
  return {
    fleetId,
    reservationId: a.reservationId,
    fence: a.fence,
    deviceId: a.deviceId,
    slot: a.slot,
    target: { id: a.targetId, source: a.source, identity: a.identity, coveredRemoteAt: a.coveredRemoteAt },
    issuedAt: a.issuedAt,
    deadlines: {
      targetScan: labelled(Deadline.labels.scanDeadline, a.scanDeadline),
      resultUpload: labelled(Deadline.labels.uploadDeadline, a.uploadDeadline),
      assignmentExpiry: labelled(Deadline.labels.expiresAt, a.expiresAt)
    },
    nextDeadline: next ? { which: whichName[next.which], label: next.label, at: next.at, remainingMs: next.remainingMs } : null,
    policy: { ...a.policy },
    state: a.state,
    lastPhase: a.lastPhase,
    lastSeq: a.lastSeq,
    lastProgressAt: a.lastProgressAt,
    outcome: a.outcome,
    finalPhase: a.finalPhase,
    endedAt: a.endedAt,
    expiry: a.expiry ? { ...a.expiry } : null,
    serverNow: now
  }
}

/** A device without its token hash. */
export const device = (d: Store.Device): z.infer<typeof WorkerApi.DeviceView> => ({
  id: d.id,
  name: d.name,
  slots: d.slots,
  createdAt: d.createdAt,
  revokedAt: d.revokedAt,
  containment: d.containment,
  reportedAt: d.reportedAt
})
