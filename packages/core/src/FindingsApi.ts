import { z } from "zod"
import * as Findings from "./Findings.js"
import * as RemoteTimestamp from "./RemoteTimestamp.js"
import { SourceSchema } from "./Source.js"
import { queryInteger, queryIntegerOr } from "./WorkerApi.js"

/**
 * The HTTP contract of findings: the admin reads and exports, and the device's
 * fleet-key request. The server parses queries with these schemas and clients
 * parse responses with them.
 */

const epochMs = z.number().int()
const flag = z.enum(["true", "false"]).transform((v) => v === "true")

const instantMessage = `must be epoch milliseconds (an integer from 0 to ${RemoteTimestamp.maxDateMs}), a date (2025-01-31) or an ISO-8601 instant with its offset (2025-01-31T09:30:00Z, or ±hh:mm)`

/**
 * A query-string instant (core's `RemoteTimestamp.parseQueryInstant`: epoch milliseconds, a date, or
 * ISO-8601 with its offset) as epoch milliseconds; anything else fails on its field.
 */
export const QueryInstant = z.string().transform((v, ctx) => {
  const t = RemoteTimestamp.parseQueryInstant(v)
  if (t === undefined) ctx.addIssue({ code: "custom", message: instantMessage })
  return t ?? z.NEVER
})

// A stored identity is at most 1,024 bytes of UTF-8 (the adapters' \`Records.maxIdentityBytes\`), so at most 1,024 UTF-16 units.
const queriedIdentity = z.string().min(1).max(1024)

/** GET /v1/admin/findings query (also the filters of /v1/admin/findings/export). */
export const ListQuery = z
  .object({
    source: SourceSchema.optional(),
    identity: queriedIdentity.optional(),
    detector: z.string().min(1).max(500).optional(),
    status: z.enum(Findings.statuses).optional(),
    verified: flag.optional(),
    /** ISO-8601 instant or epoch milliseconds: findings seen at or after it. */
    since: QueryInstant.optional(),
    /** The cursor a previous page returned as `next`. */
    after: queryInteger(0, Number.MAX_SAFE_INTEGER).optional(),
    limit: queryIntegerOr(1, 1000, 100)
  })
  .strict()

/** GET /v1/admin/findings/export query: the list filters and a format. */
export const ExportQuery = ListQuery.omit({ after: true, limit: true }).extend({ format: z.enum(["jsonl", "sarif"]).default("jsonl") }).strict()

/** A finding as every reader sees it: secrets redacted, sealed values only flagged. */
export const FindingView = z
  .object({
    id: z.number().int(),
    targetId: z.number().int(),
    source: SourceSchema,
    identity: z.string(),
    detector: z.string(),
    path: z.string(),
    line: z.number().int().nullable(),
    fingerprint: Findings.Fingerprint,
    preview: z.string(),
    verified: z.boolean().nullable(),
    status: z.enum(Findings.statuses),
    firstSeenAt: epochMs,
    lastSeenAt: epochMs,
    firstRevision: z.string().nullable(),
    lastRevision: z.string().nullable(),
    resolvedAt: epochMs.nullable(),
    resolvedRevision: z.string().nullable(),
    details: z.record(z.string(), z.unknown()),
    sealed: z.boolean()
  })
  .strict()

/** GET /v1/admin/findings: one page in id order; `next` is the cursor of the following page (null on the last). */
export const Page = z.object({ findings: z.array(FindingView), next: z.number().int().nullable() }).strict()

/** One accepted scan's summary. */
export const ScanView = z
  .object({
    reservationId: z.number().int(),
    targetId: z.number().int(),
    source: SourceSchema,
    identity: z.string(),
    revision: z.string().nullable(),
    at: epochMs,
    new: z.number().int(),
    present: z.number().int(),
    resolved: z.number().int()
  })
  .strict()

/** One change in a finding's life: new, reopened or resolved by a reservation's scan, with the revision it covered. */
export const EventView = z
  .object({ findingId: z.number().int(), reservationId: z.number().int(), kind: z.enum(["new", "reopened", "resolved"]), revision: z.string().nullable(), at: epochMs })
  .strict()

/**
 * GET /v1/admin/findings/target: one page of a target's findings (id order) with the newest
 * changes in their lives (`moreEvents` names the findings with older ones), and of its scans
 * (reservation order); `next` and `nextScans` are the cursors of the following pages (null on the last).
 */
export const TargetHistory = z
  .object({
    findings: z.array(FindingView),
    events: z.array(EventView),
    moreEvents: z.array(z.number().int()),
    scans: z.array(ScanView),
    next: z.number().int().nullable(),
    nextScans: z.number().int().nullable()
  })
  .strict()

/**
 * GET /v1/admin/findings/target query: without a cursor the first page of both lists; `after`
 * continues the findings only, `scansAfter` the scans only.
 */
export const TargetQuery = z
  .object({
    source: SourceSchema,
    identity: queriedIdentity,
    /** The `next` of a previous page. */
    after: queryInteger(0, Number.MAX_SAFE_INTEGER).optional(),
    /** The `nextScans` of a previous page. */
    scansAfter: queryInteger(0, Number.MAX_SAFE_INTEGER).optional(),
    limit: queryIntegerOr(1, 1000, 100)
  })
  .strict()

/** GET /v1/admin/findings/:id/history query: `after` is the `next` of a previous page. */
export const HistoryQuery = z
  .object({
    after: queryInteger(0, Number.MAX_SAFE_INTEGER).optional(),
    limit: queryIntegerOr(1, 1000, 100)
  })
  .strict()

/** GET /v1/admin/findings/:id/history: one finding's changes in the order they happened, a keyset page at a time. */
export const History = z.object({ events: z.array(EventView), next: z.number().int().nullable() }).strict()

/** GET /v1/device/fleet-key: the key devices fingerprint secrets with (hex), and its id so a rotation shows. */
export const FleetKey = z.object({ keyId: z.string(), key: z.string().regex(/^[0-9a-f]{64}$/) }).strict()
