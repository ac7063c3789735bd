import { z } from "zod"
import { outcomes, states } from "./Assignment.js"
import { ManagedConfigSchema } from "./Config.js"
import { EventSchema, PhaseSchema } from "./PhaseModel.js"
import { MetricSchema } from "./Percentile.js"
import { SourceSchema } from "./Source.js"
import { StatusSchema } from "./Target.js"

/**
 * The HTTP contract between devices, operators and the server (`/v1`). The
 * server parses requests with these schemas and the worker client parses
 * responses with them: one description of each shape.
 */

const epochMs = z.number().int()
const id = z.number().int().min(1).max(Number.MAX_SAFE_INTEGER)

/** Maximum result body accepted, bytes. */
export const maxResultBytes = 1_048_576
/** Most findings one result may carry. */
export const maxFindings = 10_000
/** Longest log (characters) one result may carry. */
export const maxLogChars = 65_536
/** Maximum events in one progress batch. */
export const maxEventsPerBatch = 1000
/** Deepest nesting of arrays and objects accepted in a JSON body (the body itself is level 1). */
export const maxJsonDepth = 64
/** Longest string accepted anywhere in a JSON body, in UTF-16 code units, unless its field says less. */
export const maxStringLength = 65_536
/** Longest object key accepted anywhere in a JSON body, in UTF-16 code units. */
export const maxKeyLength = 1024
const loneSurrogate = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/

/**
 * Why a string cannot cross the edge, if it cannot: a NUL (PostgreSQL refuses it in text, and it
 * ends C strings), an unpaired surrogate (it cannot be stored as UTF-8 exactly), or more than
 * `max` UTF-16 code units.
 */
export const refuseString = (s: string, max: number): string | undefined => {
  if (s.length > max) return `longer than ${max} characters (${s.length})`
  if (s.includes("\u0000")) return "contains a NUL character (U+0000)"
  if (loneSurrogate.test(s)) return "contains an unpaired UTF-16 surrogate"
  return undefined
}

/** Longest name of who acts (the `X-Scanfleet-Actor` header, the command line's `--by`), in characters. */
export const maxActorLength = 200

// C0 and C1 controls (DEL among them), and bidirectional embeddings, overrides and isolates.
const controlCharacter = /[\u0000-\u001F\u007F-\u009F]/
const bidiControl = /[\u202A-\u202E\u2066-\u2069]/

/**
 * Why a name shown to operators (a device name, a target's identity, who acted) could be
 * misread, if it could: a control character (C0 or C1: a terminal or log reader acts on it), a
 * bidirectional control (it makes a name read as another one), or white space at either end.
 */
export const labelProblem = (s: string): string | undefined => {
  if (controlCharacter.test(s)) return "contains a control character"
  if (bidiControl.test(s)) return "contains a bidirectional control character"
  if (s.trim() !== s) return "starts or ends with white space"
  return undefined
}

/** A name shown to operators: `labelProblem` refuses it with its reason. */
const label = (max: number) =>
  z
    .string()
    .min(1)
    .max(max)
    .superRefine((s, ctx) => {
      const why = labelProblem(s)
      if (why) ctx.addIssue({ code: z.ZodIssueCode.custom, message: why })
    })

/** Where a JSON value breaks the edge's limits, and how. */
export interface EdgeIssue {
  readonly path: ReadonlyArray<string | number>
  readonly message: string
}

interface Frame {
  readonly value: unknown
  readonly parent: Frame | undefined
  readonly key: string | number
  readonly level: number
}

const pathOf = (f: Frame | undefined): Array<string | number> => {
  const path: Array<string | number> = []
  for (let x = f; x?.parent !== undefined; x = x.parent) path.push(x.key)
  return path.reverse()
}

/**
 * The first place where a parsed JSON value breaks the edge's limits, walked without recursion: a
 * string or key that holds a NUL or an unpaired surrogate or is too long (`maxStringLength`,
 * `maxKeyLength`), or an array or object nested past `maxJsonDepth`. `level` is the level the
 * value itself sits at in its body (1 for the body; 3 for one finding of a result). The server
 * refuses a body with such a place; a device leaves such a finding out of its result.
 */
export const edgeIssue = (value: unknown, level = 1): EdgeIssue | undefined => {
  const stack: Array<Frame> = [{ value, parent: undefined, key: "", level }]
  while (stack.length > 0) {
    const f = stack.pop()!
    const v = f.value
    if (typeof v === "string") {
      const why = refuseString(v, maxStringLength)
      if (why) return { path: pathOf(f), message: why }
    } else if (typeof v === "object" && v !== null) {
      if (f.level > maxJsonDepth) return { path: pathOf(f), message: `nested deeper than ${maxJsonDepth} levels` }
      if (Array.isArray(v)) {
        for (let i = v.length - 1; i >= 0; i--) stack.push({ value: v[i], parent: f, key: i, level: f.level + 1 })
      } else {
        const keys = Object.keys(v)
        for (let i = keys.length - 1; i >= 0; i--) {
          const k = keys[i]
          const why = refuseString(k, maxKeyLength)
          if (why) return { path: [...pathOf(f), k], message: `the key ${why}` }
          stack.push({ value: (v as Record<string, unknown>)[k], parent: f, key: k, level: f.level + 1 })
        }
      }
    }
  }
  return undefined
}

/** Longest query-string key or value accepted, in UTF-16 code units. */
export const maxQueryLength = 1024
/** Longest claim deadline a client may send: its own patience for the answer, in milliseconds. */
export const maxClaimWaitMs = 300_000

/** POST /v1/assignments/claim */
export const ClaimRequest = z
  .object({
    slot: z.number().int().min(0).max(1023),
    /**
     * How long the client waits for this answer, in milliseconds from when the server
     * receives it: no claim commits later, so a claim never holds a slot its client gave up on.
     */
    waitMs: z.number().int().min(1).max(maxClaimWaitMs).optional()
  })
  .strict()

/** One labelled deadline. */
export const LabelledDeadline = z.object({ label: z.string(), at: epochMs, iso: z.string() }).strict()

/** A fleet id: one per database, stable for its lifetime. */
export const FleetId = z.string().min(1).max(100)

/** An assignment as a device or an operator sees it. */
export const AssignmentView = z
  .object({
    /** The fleet (database) that issued it: a device keys its journal by (fleet, reservation). */
    fleetId: FleetId,
    reservationId: id,
    fence: z.number().int(),
    deviceId: id,
    slot: z.number().int(),
    target: z.object({ id, source: SourceSchema, identity: z.string(), coveredRemoteAt: epochMs.nullable() }).strict(),
    issuedAt: epochMs,
    deadlines: z
      .object({ targetScan: LabelledDeadline, resultUpload: LabelledDeadline, assignmentExpiry: LabelledDeadline })
      .strict(),
    nextDeadline: z.object({ which: z.enum(["targetScan", "resultUpload", "assignmentExpiry"]), label: z.string(), at: epochMs, remainingMs: z.number() }).strict().nullable(),
    policy: z
      .object({
        source: SourceSchema,
        origin: z.enum(["override", "global"]),
        ttlSeconds: z.number().int(),
        scanTimeoutSeconds: z.number().int(),
        uploadTimeoutSeconds: z.number().int(),
        handoffMarginSeconds: z.number().int()
      })
      .strict(),
    state: z.enum(states),
    lastPhase: PhaseSchema.nullable(),
    lastSeq: z.number().int(),
    lastProgressAt: epochMs.nullable(),
    outcome: z.enum(outcomes).nullable(),
    finalPhase: PhaseSchema.nullable(),
    endedAt: epochMs.nullable(),
    expiry: z.object({ lastPhase: PhaseSchema.nullable(), lastProgressAt: epochMs.nullable(), expiredAt: epochMs }).strict().nullable(),
    serverNow: epochMs
  })
  .strict()
/** An assignment view. */
export type AssignmentView = z.infer<typeof AssignmentView>

/** Response of a claim: the assignment, or null when nothing is pending. */
export const ClaimResponse = z.object({ assignment: AssignmentView.nullable() }).strict()

/** POST /v1/assignments/:id/progress */
export const ProgressRequest = z.object({ fence: z.number().int().min(0), events: z.array(EventSchema).min(1).max(maxEventsPerBatch) }).strict()
/** Per-event acceptance. */
export const ProgressResponse = z
  .object({
    results: z.array(z.object({ seq: z.number().int(), status: z.enum(["accepted", "duplicate"]), acceptedAt: epochMs }).strict()),
    latestPhase: PhaseSchema.nullable(),
    lastSeq: z.number().int(),
    /** Unchanged by progress: shown so a client can see nothing was renewed. */
    assignmentExpiry: epochMs
  })
  .strict()

/** One finding reported by a scanner. */
export const Finding = z.record(z.string(), z.unknown())

/** POST /v1/assignments/:id/result */
export const ResultRequest = z
  .object({
    fence: z.number().int().min(0),
    outcome: z.enum(outcomes),
    finalPhase: PhaseSchema.nullable(),
    findings: z.array(Finding).max(maxFindings),
    log: z.string().max(maxLogChars).default("")
  })
  .strict()
/** The receipt of an accepted result. */
export const Receipt = z.object({ receiptId: z.string(), reservationId: id, outcome: z.enum(outcomes), acceptedAt: epochMs }).strict()

/** The error body of every refusal: a code, a message, and the field at fault where there is one. */
export const ErrorBody = z
  .object({
    error: z.string(),
    message: z.string(),
    issues: z.array(z.object({ path: z.array(z.union([z.string(), z.number()])), message: z.string() }).strict()).optional(),
    /** With `claim_rejected:slot_busy`: the caller's own active reservation that holds the slot, which it may release. */
    holder: z.object({ reservationId: id, fence: z.number().int() }).strict().optional()
  })
  .strict()
/** An error body. */
export type ErrorBody = z.infer<typeof ErrorBody>

/** POST /v1/admin/config/preview and /apply take a managed configuration document. */
export const ConfigDocument = ManagedConfigSchema

const integerText = (min: number, max: number) =>
  z
    .string()
    .regex(/^[0-9]{1,16}$/, "must be an integer in decimal digits")
    .transform(Number)
    .pipe(z.number().int().min(min).max(max))

/**
 * A query-string integer from `min` to `max`, written in decimal digits and nothing else: `1e3`,
 * ` 1`, `0x10`, `1.0`, `+1` and an empty value are refused at their field, not read as numbers.
 */
export const queryInteger = (min: number, max: number) => integerText(min, max).meta({ description: `an integer from ${min} to ${max}, in decimal digits` })

/** `queryInteger`, and `fallback` when the key is absent. */
export const queryIntegerOr = (min: number, max: number, fallback: number) =>
  integerText(min, max)
    .default(fallback)
    .meta({ description: `an integer from ${min} to ${max}, in decimal digits; ${fallback} when absent` })

/** A positive query-string number up to `max` in decimal digits with at most six decimals (`0.5`, `24`), and `fallback` when absent. */
export const queryDecimalOr = (max: number, fallback: number) =>
  z
    .string()
    .regex(/^[0-9]{1,9}(\.[0-9]{1,6})?$/, "must be a number in decimal digits (as 24 or 0.5)")
    .transform(Number)
    .pipe(z.number().positive().max(max))
    .default(fallback)
    .meta({ description: `a number above 0 and at most ${max}, in decimal digits with at most six decimals; ${fallback} when absent` })

/** GET /v1/admin/percentiles query. */
export const PercentileQuery = z
  .object({
    source: SourceSchema.optional(),
    metric: MetricSchema.optional(),
    outcome: z.enum(outcomes).optional(),
    windowHours: queryDecimalOr(24 * 90, 24)
  })
  .strict()

/** GET /v1/admin/targets counts. */
export const TargetCounts = z.array(z.object({ source: SourceSchema, status: StatusSchema, count: z.number().int() }).strict())

/** POST /v1/admin/devices */
export const DeviceCreate = z.object({ name: label(200), slots: z.number().int().min(1).max(1024) }).strict()

/** POST /v1/assignments/:id/release: gives an active reservation back to the queue. */
export const ReleaseRequest = z.object({ fence: z.number().int().min(0) }).strict()

/** GET /v1/admin/assignments query. */
export const AssignmentListQuery = z
  .object({ state: z.enum(states).optional(), limit: queryIntegerOr(1, 1000, 100) })
  .strict()

/** GET /v1/admin/assignments: views, newest first. */
export const AssignmentList = z.object({ assignments: z.array(AssignmentView) }).strict()

/** One accepted timeline event, with the server time it was accepted. */
export const TimelineEvent = EventSchema.extend({ acceptedAt: epochMs })

/** GET /v1/admin/assignments/:id: one view and its accepted timeline. */
export const AssignmentDetail = z.object({ assignment: AssignmentView, timeline: z.array(TimelineEvent) }).strict()

/** A registered device (never its token), with the containment its worker last reported. */
export const DeviceView = z
  .object({ id, name: z.string(), slots: z.number().int(), createdAt: epochMs, revokedAt: epochMs.nullable(), containment: z.string().nullable(), reportedAt: epochMs.nullable() })
  .strict()

/** POST /v1/device/register: a starting worker reports how its scan stages are contained. */
export const RegisterRequest = z.object({ containment: z.string().min(1).max(64) }).strict()

/** Response of a registration: the fleet the server belongs to and the device as recorded. */
export const Registered = z.object({ fleetId: FleetId, device: DeviceView, serverNow: epochMs }).strict()

/** Response of POST /v1/admin/devices: the token is shown this once and never stored in clear. */
export const DeviceCreated = z.object({ device: DeviceView, token: z.string() }).strict()

/** A source's effective assignment policy and where its TTL comes from. */
export const EffectivePolicyView = z
  .object({
    source: SourceSchema,
    origin: z.enum(["override", "global"]),
    ttlSeconds: z.number().int(),
    scanTimeoutSeconds: z.number().int(),
    uploadTimeoutSeconds: z.number().int(),
    handoffMarginSeconds: z.number().int()
  })
  .strict()

/** GET /v1/admin/config: the document in force (the defaults before any apply) and each source's effective policy. */
export const ConfigView = z
  .object({
    version: z.number().int().nullable(),
    origin: z.enum(["applied", "defaults"]),
    appliedBy: z.string().nullable(),
    appliedAt: epochMs.nullable(),
    document: ManagedConfigSchema,
    effective: z.array(EffectivePolicyView)
  })
  .strict()

/** Response of POST /v1/admin/config/preview for a valid candidate (nothing is written). */
export const PreviewResponse = z.object({ valid: z.literal(true), document: ManagedConfigSchema, effective: z.array(EffectivePolicyView) }).strict()

/** GET /v1/admin/cycles query. */
export const CycleListQuery = z.object({ source: SourceSchema.optional(), limit: queryIntegerOr(1, 1000, 50) }).strict()

/** One discovery cycle record. */
export const CycleView = z
  .object({
    id,
    source: SourceSchema,
    startedAt: epochMs,
    endedAt: epochMs,
    pages: z.number().int(),
    results: z.number().int(),
    malformed: z.number().int(),
    queuedNewCount: z.number().int(),
    queuedUpdatedCount: z.number().int(),
    deferredCount: z.number().int(),
    stopReason: z.enum(["end_of_listing", "page_limit", "result_limit", "known_page", "error"]),
    error: z.string().nullable()
  })
  .strict()

/** GET /v1/admin/cycles: newest first. */
export const CycleList = z.object({ cycles: z.array(CycleView) }).strict()

/** A percentile, or the label that there are too few samples to state one. */
export const QuantileView = z.union([
  z.object({ status: z.literal("ok"), value: z.number() }).strict(),
  z.object({ status: z.literal("insufficient"), count: z.number().int(), required: z.number().int() }).strict()
])

/** One group of a percentile answer. */
export const PercentileRowView = z
  .object({ source: SourceSchema, metric: MetricSchema, outcome: z.enum(outcomes), count: z.number().int(), p50: QuantileView, p95: QuantileView, p99: QuantileView })
  .strict()

/** GET /v1/admin/percentiles: the window, the minimum sample count, and one row per source, metric and outcome. */
export const PercentileResponse = z
  .object({ from: epochMs, to: epochMs, windowHours: z.number(), minSamples: z.number().int(), rows: z.array(PercentileRowView) })
  .strict()

/** GET /v1/admin/summary: the numbers the dashboard leads with. */
export const SummaryView = z
  .object({
    targets: z
      .object({
        queuedNew: z.number().int(),
        queuedUpdated: z.number().int(),
        pending: z.number().int(),
        inProgress: z.number().int(),
        completed: z.number().int(),
        failed: z.number().int()
      })
      .strict(),
    assignments: z
      .object({
        running: z.number().int(),
        completed: z.number().int(),
        timedOut: z.number().int(),
        failed: z.number().int(),
        expired: z.number().int(),
        released: z.number().int()
      })
      .strict(),
    serverNow: epochMs
  })
  .strict()

/** A query string that takes no parameters. */
export const EmptyQuery = z.object({}).strict()

/**
 * The schemas that share their name with a type, under a second name: the
 * bundled `.d.ts` keeps only the type of such a pair, so packages built
 * against `dist` refer to the schema by this one.
 */
export const AssignmentViewSchema = AssignmentView
/** See `AssignmentViewSchema`. */
export const ErrorBodySchema = ErrorBody
