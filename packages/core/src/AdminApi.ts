import { z } from "zod"
import { QueryInstant } from "./FindingsApi.js"
import { actions } from "./Operations.js"
import { PrioritySchema } from "./Priority.js"
import { SourceSchema } from "./Source.js"
import { StatusSchema } from "./Target.js"
import { AssignmentView, DeviceView, queryInteger, queryIntegerOr, TimelineEvent } from "./WorkerApi.js"

/**
 * The HTTP contract of the operator endpoints (`/v1/admin/...`) beyond the v1 admin API in
 * `WorkerApi`: targets, assignments, sources, devices and the audit log. One description of
 * each shape, for the server, the CLI and the API reference.
 */

const epochMs = z.number().int()
const id = z.number().int().min(1).max(Number.MAX_SAFE_INTEGER)

/** Why an operator acts, recorded in the audit log. */
export const Reason = z.string().trim().min(1, "say why: the reason is recorded in the audit log").max(500)

/** At most this many targets in one add request. */
export const maxAddBatch = 1000

/** One target an operator adds; `remoteAt`, when given, must be a valid remote timestamp (ISO-8601 with an offset). */
export const TargetInput = z.object({ source: SourceSchema, identity: z.string().min(1), remoteAt: z.string().nullable().optional() }).strict()

/** POST /v1/admin/targets */
export const AddTargets = z.object({ targets: z.array(TargetInput).min(1).max(maxAddBatch), reason: Reason }).strict()

/** What adding targets did. */
export const AddTargetsResult = z.object({ inserted: z.array(z.string()), known: z.number().int() }).strict()


/** GET /v1/admin/targets/search */
export const TargetSearchQuery = z
  .object({
    source: SourceSchema.optional(),
    status: StatusSchema.optional(),
    prefix: z.string().min(1).max(1024).optional(),
    /** Epoch milliseconds or an ISO-8601 instant. */
    changedSince: QueryInstant.optional(),
    after: queryInteger(0, Number.MAX_SAFE_INTEGER).optional(),
    limit: queryIntegerOr(1, 500, 50)
  })
  .strict()

/** A target with every lifecycle field. */
export const TargetView = z
  .object({
    id,
    source: SourceSchema,
    identity: z.string(),
    status: StatusSchema,
    observedRemoteAt: epochMs.nullable(),
    coveredRemoteAt: epochMs.nullable(),
    completedAt: epochMs.nullable(),
    lastScanStartedAt: epochMs.nullable(),
    fence: z.number().int(),
    attempts: z.number().int(),
    discoveredAt: epochMs,
    priority: PrioritySchema,
    changedAt: epochMs,
    redrive: z.object({ redrives: z.number().int(), revision: epochMs.nullable(), retryAt: epochMs.nullable(), plannedFence: z.number().int().nullable() }).strict()
  })
  .strict()

/** One page of a target search. */
export const TargetPage = z.object({ targets: z.array(TargetView), next: z.number().int().nullable() }).strict()

/**
 * The most assignments one inspection shows. With each timeline bounded (`Operations.apiTimeline`:
 * its phase events and newest 20, at most 32 events of up to 1,000 characters), one answer stays
 * within a few megabytes whatever devices have sent.
 */
export const maxInspectedAssignments = 50

/** GET /v1/admin/targets/inspect */
export const TargetKeyQuery = z.object({ source: SourceSchema, identity: z.string().min(1), limit: queryIntegerOr(1, maxInspectedAssignments, 20) }).strict()

/** A cancelled reservation's record. */
export const CancellationView = z.object({ reservationId: id, at: epochMs, who: z.string(), why: z.string() }).strict()

/**
 * A target with its assignments, newest first, each with its timeline: every phase event and the
 * newest 20 events; `omittedEvents` counts the older (recovered) events left out, which
 * GET /v1/admin/assignments/:id returns with the rest.
 */
export const Inspection = z
  .object({
    target: TargetView,
    assignments: z.array(
      z.object({ assignment: AssignmentView, timeline: z.array(TimelineEvent), omittedEvents: z.number().int().min(0), cancellation: CancellationView.nullable() }).strict()
    )
  })
  .strict()

/** POST /v1/admin/targets/requeue */
export const Requeue = z.object({ source: SourceSchema, identity: z.string().min(1), reason: Reason }).strict()

/** POST /v1/admin/targets/priority: a priority in [Priority.min, Priority.max]; 0 is the default. */
export const SetPriority = z.object({ source: SourceSchema, identity: z.string().min(1), priority: PrioritySchema, reason: Reason }).strict()

/** POST /v1/admin/assignments/:id/cancel, /v1/admin/sources/:source/pause and /resume */
export const WithReason = z.object({ reason: Reason }).strict()

/** A source's runtime controls. */
export const SourceControlView = z
  .object({ source: SourceSchema, paused: z.boolean(), pausedAt: epochMs.nullable(), pausedBy: z.string().nullable(), reason: z.string().nullable() })
  .strict()

/** GET /v1/admin/sources */
export const SourceControls = z.object({ sources: z.array(SourceControlView) }).strict()

/** POST /v1/admin/devices/:id/sources: the sources a device may claim (null: all; none: it claims nothing, which drains it), each once. */
export const DeviceSources = z
  .object({
    sources: z
      .array(SourceSchema)
      .max(4)
      .superRefine((sources, ctx) =>
        sources.forEach((s, i) => {
          if (sources.indexOf(s) !== i) ctx.addIssue({ code: "custom", path: [i], message: `${s} is listed twice` })
        })
      )
      .nullable(),
    reason: Reason
  })
  .strict()

/** A device as operators see it. */
export const DeviceDetailView = DeviceView.extend({
  sources: z.array(SourceSchema).nullable(),
  lastContactAt: epochMs.nullable(),
  active: z.array(AssignmentView)
}).strict()

/** GET /v1/admin/devices */
export const DeviceList = z.object({ devices: z.array(DeviceDetailView) }).strict()

/** DELETE /v1/admin/devices/:id: the device and the reservations its revocation ended. */
export const Revoked = z.object({ revoked: id, released: z.array(id) }).strict()

/** DELETE /v1/admin/devices/:id?reason= */
export const RevokeQuery = z.object({ reason: Reason.optional() }).strict()

/** One audit log entry. */
export const AuditEntryView = z
  .object({ id, at: epochMs, who: z.string(), action: z.enum(actions), subject: z.string(), why: z.string(), detail: z.unknown() })
  .strict()

/** GET /v1/admin/audit */
export const AuditQuery = z.object({ before: queryInteger(1, Number.MAX_SAFE_INTEGER).optional(), limit: queryIntegerOr(1, 500, 50) }).strict()

/** The audit log, newest first. */
export const AuditList = z.object({ entries: z.array(AuditEntryView) }).strict()

/** GET /readyz */
export const Readiness = z
  .object({ ready: z.boolean(), checks: z.array(z.object({ name: z.enum(["database", "migrations", "sweeper"]), ok: z.boolean(), detail: z.string() }).strict()) })
  .strict()
