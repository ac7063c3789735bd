import { AdminApi, Config, WorkerApi } from "@scanfleet/core"
import { z } from "zod"
import { maxActorLength } from "./AdminRoutes.js"
import { maxFormBytes } from "./Console.js"
import * as FindingReference from "./FindingReference.js"

/** One endpoint of the HTTP API, with the zod schemas of what it takes and returns. */
export interface Endpoint {
  readonly method: "GET" | "POST" | "DELETE"
  readonly path: string
  readonly auth: "device" | "admin" | "admin (bearer or cookie)" | "none"
  readonly summary: string
  readonly query?: z.ZodType
  readonly body?: z.ZodType
  /** A body the endpoint accepts (ids and fences are placeholders), shown in the reference. */
  readonly example?: unknown
  /** Request headers the endpoint reads, with their longest accepted length in characters. */
  readonly headers?: Readonly<Record<string, number>>
  /** Body limit when it differs from the server's `maxBodyBytes`. */
  readonly bodyLimit?: string
  readonly response?: { readonly status: number; readonly schema?: z.ZodType; readonly note?: string }
  /** Refusals specific to this endpoint, besides the common ones. */
  readonly errors?: ReadonlyArray<string>
}

const Empty = z.object({}).strict()

/** The Worker API: what devices call. */
export const worker: ReadonlyArray<Endpoint> = [
  {
    method: "POST",
    path: "/v1/device/register",
    auth: "device",
    summary:
      "A starting worker reports the containment level in force for its scan stages (`pid-namespace`, `cgroup-v2`, `cgroup-v1-freezer` or `freeze-kill`, in the worker's words); the server keeps it on the device and answers with its fleet id, which every assignment also carries, so the worker delivers its journal only to the fleet that issued it.",
    body: WorkerApi.RegisterRequest,
    example: { containment: "pid-namespace" },
    response: { status: 200, schema: WorkerApi.Registered },
    errors: ["404 the device was revoked meanwhile"]
  },
  {
    method: "POST",
    path: "/v1/assignments/claim",
    auth: "device",
    summary:
      "Claims the next pending target for one slot of the calling device. The assignment carries the three immutable deadlines (target-scan deadline, result-upload deadline, assignment expiry), which fires next, the effective policy of the target's source with its origin (override or global), and the covered remote timestamp. `assignment` is null when nothing is pending.",
    body: WorkerApi.ClaimRequest,
    example: { slot: 0, waitMs: 9000 },
    response: { status: 200, schema: WorkerApi.ClaimResponse },
    errors: [
      "400 `slot` at or above the device's slot count",
      "409 `claim_rejected:slot_busy` | `claim_rejected:capacity` | `claim_rejected:source_cap`; `slot_busy` for a slot one of the device's reservations holds names it in `holder` (`reservationId`, `fence`): a device that does not know it (the claim's answer was lost, or its local state was) can release it rather than wait for its assignment expiry"
    ]
  },
  {
    method: "POST",
    path: "/v1/assignments/:id/progress",
    auth: "device",
    summary:
      "Appends a batch of phase events to the caller's reservation, idempotently by sequence number: an already accepted sequence with the same content answers `duplicate` with its original `acceptedAt`. Progress never renews any deadline: `assignmentExpiry` is returned so a client can see it did not move.",
    body: WorkerApi.ProgressRequest,
    example: { fence: 1, events: [{ seq: 1, kind: "phase", phase: "assigned", at: 1764579600000, detail: "slot 0" }] },
    response: { status: 200, schema: WorkerApi.ProgressResponse },
    errors: [
      "403 `reservation_refused:not_owner` | `stale_fence` | `expired` | `not_active`",
      "404 the reservation does not exist",
      "422 `progress_rejected:sequence_gap` | `illegal_transition` | `conflict` | `terminal`, with the path of the refused event (`events.<i>.seq`); nothing of the batch is stored"
    ]
  },
  {
    method: "POST",
    path: "/v1/assignments/:id/result",
    auth: "device",
    summary:
      "Uploads the result under the result-upload deadline and answers with the receipt. A resubmission answers with the original receipt. The outcome decides the target's status (clean and findings complete it; unsupported leaves it unresolved; the rest fail it).",
    body: WorkerApi.ResultRequest,
    example: { fence: 1, outcome: "findings", finalPhase: "staging", findings: [{ scanner: "gitleaks", detector: "aws-access-token", path: "config/prod.env", line: 3, fingerprint: `hmac-sha256:${"3f1c".repeat(16)}`, preview: "AKIA…(20)", secretFields: ["Secret", "Match"] }], log: "1 finding" },
    bodyLimit: `${WorkerApi.maxResultBytes} bytes`,
    response: { status: 200, schema: WorkerApi.Receipt },
    errors: ["403 `reservation_refused:upload_deadline_passed` | `expired` | `stale_fence` | `not_owner` | `not_active`", "404 the reservation does not exist", "413 the body exceeds the limit", "422 `unredacted_finding`: a finding still carries a declared secret field in the clear, is not a redacted finding, or carries raw values the server does not accept (see docs/findings.md); nothing is stored"]
  },
  {
    method: "POST",
    path: "/v1/assignments/:id/release",
    auth: "device",
    summary: "Gives an active reservation back; the target returns to pending.",
    body: WorkerApi.ReleaseRequest,
    example: { fence: 1 },
    response: { status: 200, schema: WorkerApi.AssignmentViewSchema },
    errors: ["403 `reservation_refused:*`", "404 the reservation does not exist"]
  },
  {
    method: "GET",
    path: "/v1/assignments/:id",
    auth: "device",
    summary: "The caller's own assignment, with the deadlines labelled and the one that fires next.",
    response: { status: 200, schema: WorkerApi.AssignmentViewSchema },
    errors: ["403 the reservation belongs to another device", "404 the reservation does not exist"]
  }
]

/** The admin API: what operators call with the admin token. */
export const admin: ReadonlyArray<Endpoint> = [
  {
    method: "POST",
    path: "/v1/admin/config/preview",
    auth: "admin",
    summary: "Validates a candidate managed configuration with core's rules (shape, then every source's effective TTL ≥ scan timeout + upload timeout + handoff margin). Writes nothing.",
    body: WorkerApi.ConfigDocument,
    example: Config.defaults,
    response: { status: 200, schema: WorkerApi.PreviewResponse },
    errors: ["422 `invalid_config` with one issue per violation, each at its field path with a sentence naming the fields to change"]
  },
  {
    method: "POST",
    path: "/v1/admin/config/apply",
    auth: "admin",
    summary: "Validates like preview and stores the document as the next version; an invalid document is refused whole. The optional `X-Scanfleet-Actor` header names who applied it (default `admin`). New assignments use it at once; issued ones keep their deadlines.",
    body: WorkerApi.ConfigDocument,
    example: Config.defaults,
    headers: { "X-Scanfleet-Actor": maxActorLength },
    response: { status: 201, schema: WorkerApi.ConfigView },
    errors: ["422 `invalid_config` as for preview; nothing is stored"]
  },
  {
    method: "GET",
    path: "/v1/admin/config",
    auth: "admin",
    summary: "The configuration in force (`origin: defaults` before the first apply) and each source's effective policy.",
    response: { status: 200, schema: WorkerApi.ConfigView }
  },
  {
    method: "POST",
    path: "/v1/admin/devices",
    auth: "admin",
    summary: "Registers a device. The token is in this response only; the server keeps its SHA-256. The name is at most 200 characters, without control characters, bidirectional controls or white space at either end. Audited as `register_device` (the optional `X-Scanfleet-Actor` header names who, default `admin`).",
    body: WorkerApi.DeviceCreate,
    headers: { "X-Scanfleet-Actor": maxActorLength },
    example: { name: "scanner-01", slots: 4 },
    response: { status: 201, schema: WorkerApi.DeviceCreated }
  },
  {
    method: "GET",
    path: "/v1/admin/assignments",
    auth: "admin",
    summary: "Assignments in a state, newest first, as the same labelled views devices get. Expired ones carry their evidence (`expiry.lastPhase`, `expiry.lastProgressAt`).",
    query: WorkerApi.AssignmentListQuery,
    response: { status: 200, schema: WorkerApi.AssignmentList }
  },
  {
    method: "GET",
    path: "/v1/admin/assignments/:id",
    auth: "admin",
    summary: "One assignment and its accepted timeline.",
    response: { status: 200, schema: WorkerApi.AssignmentDetail },
    errors: ["404 no such assignment"]
  },
  {
    method: "GET",
    path: "/v1/admin/cycles",
    auth: "admin",
    summary: "Discovery cycle records, newest first, with `queuedNewCount` and `queuedUpdatedCount` (which never overlap).",
    query: WorkerApi.CycleListQuery,
    response: { status: 200, schema: WorkerApi.CycleList }
  },
  {
    method: "GET",
    path: "/v1/admin/targets",
    auth: "admin",
    summary: "Target counts by source and status.",
    query: Empty,
    response: { status: 200, schema: WorkerApi.TargetCounts }
  },
  {
    method: "GET",
    path: "/v1/admin/percentiles",
    auth: "admin",
    summary:
      "p50/p95/p99 durations (milliseconds; linear interpolation, as PostgreSQL's `percentile_cont`, read from log-bucket counts: within 0.9% of it) by source, metric and outcome over the last `windowHours` (durations that ended after `from` and up to `to`, both in the answer), with sample counts. Below the configured `metrics.minSamples` a value is `{ status: \"insufficient\", count, required }` instead of a number. Within a source and outcome that has data, every metric is listed.",
    query: WorkerApi.PercentileQuery,
    response: { status: 200, schema: WorkerApi.PercentileResponse }
  },
  {
    method: "GET",
    path: "/v1/admin/summary",
    auth: "admin",
    summary: "The dashboard's headline numbers: targets queued new and updated (sums over the recorded cycles), pending, in progress, completed, failed; assignments running, completed, timed out (outcome `killed_at_deadline`), failed (any other unsuccessful outcome: each assignment is counted once), expired, released.",
    query: Empty,
    response: { status: 200, schema: WorkerApi.SummaryView }
  }
]

/** The operator endpoints: inspect, steer and redrive the fleet. Every change is audited (`X-Scanfleet-Actor` names who, `reason` says why). */
// Every operator action under /v1/admin (each write) names who acted by the same header.
const named = (e: Endpoint): Endpoint => (e.method !== "GET" && e.path.startsWith("/v1/admin/") ? { ...e, headers: { "X-Scanfleet-Actor": maxActorLength, ...e.headers } } : e)

export const operations: ReadonlyArray<Endpoint> = ([
  {
    method: "POST",
    path: "/v1/admin/targets",
    auth: "admin",
    summary:
      "Adds targets (one or a batch of up to 1000) as discovery records are admitted: a new identity becomes a pending target, a known one only has its observed remote time raised. Identities are checked as discovery checks them (no control characters, valid Unicode, at most 1024 UTF-8 bytes); a `remoteAt`, when given, must be a valid remote timestamp (ISO-8601 with an offset, after 2000, not ahead of the server clock by more than 5 minutes; never for DockerHub). Any problem refuses the whole batch.",
    body: AdminApi.AddTargets,
    response: { status: 201, schema: AdminApi.AddTargetsResult },
    errors: ["400 `invalid_body` with each problem at its path (`targets.<i>.identity`, `targets.<i>.remoteAt`, `reason`)"]
  },
  {
    method: "GET",
    path: "/v1/admin/targets/search",
    auth: "admin",
    summary:
      "Targets matching every filter given (source, status, identity prefix, `changedSince` as epoch milliseconds or an ISO-8601 instant: the newest of discovery, last scan start, completion and the end of the last assignment), in id order. Keyset pagination: pass the answer's `next` as `after` for the next page; `next` is null on the last page.",
    query: AdminApi.TargetSearchQuery,
    response: { status: 200, schema: AdminApi.TargetPage }
  },
  {
    method: "GET",
    path: "/v1/admin/targets/inspect",
    auth: "admin",
    summary:
      "One target with every lifecycle field (status, fence, observed and covered remote times, attempts at this revision, the failure backoff state) and its newest `limit` assignments (default 20, at most 50), each with its three labelled deadlines, its accepted timeline, its expiry evidence and, if an operator cancelled it, who, when and why. A timeline shows every phase event and the newest 20 events, with details; `omittedEvents` counts the older `recovered` events left out (a device may record up to 989 of them), and `GET /v1/admin/assignments/:id` returns that assignment's whole timeline. So one answer stays bounded (at most 50 × 32 events) whatever devices have sent.",
    query: AdminApi.TargetKeyQuery,
    response: { status: 200, schema: AdminApi.Inspection },
    errors: ["404 no such target"]
  },
  {
    method: "POST",
    path: "/v1/admin/targets/requeue",
    auth: "admin",
    summary: "Puts a target that is not in flight (completed, failed, unresolved, deferred) back to pending with a fresh expiry budget and failure backoff; the fence is bumped. Audited.",
    body: AdminApi.Requeue,
    response: { status: 200, schema: AdminApi.TargetView },
    errors: ["404 no such target", "409 `operation_refused:in_progress` (cancel its assignment first) | `operation_refused:already_pending`"]
  },
  {
    method: "POST",
    path: "/v1/admin/targets/priority",
    auth: "admin",
    summary:
      "Sets a target's claim priority, an integer in [-100, 100] (0 by default), kept until changed (also across rescans). Claims take pending targets by `id - priority × 10000`, then id: a priority `p` claims a target as if it had been discovered `p × 10000` targets earlier, so urgent work goes ahead of newer work and of older work up to that shift, and no target is ever passed by more than 2,000,000 targets discovered after it (no starvation). Not an authority change: an assignment in flight keeps its fence. Audited with the previous and the new value.",
    body: AdminApi.SetPriority,
    response: { status: 200, schema: AdminApi.TargetView },
    errors: ["404 no such target"]
  },
  {
    method: "POST",
    path: "/v1/admin/assignments/:id/cancel",
    auth: "admin",
    summary:
      "Ends an active reservation at once and returns its target to pending (fence bumped). The device's next write to it (progress, result, release) is refused with 403 `reservation_refused:cancelled`, naming who cancelled it and why, so the worker stops the scan. Audited.",
    body: AdminApi.WithReason,
    response: { status: 200, note: "`{ assignment }`, the ended assignment view" },
    errors: ["404 no such assignment", "409 `operation_refused:not_active`"]
  },
  {
    method: "GET",
    path: "/v1/admin/sources",
    auth: "admin",
    summary: "Each source's runtime controls: paused or not, and who paused it, when and why.",
    query: WorkerApi.EmptyQuery,
    response: { status: 200, schema: AdminApi.SourceControls }
  },
  {
    method: "POST",
    path: "/v1/admin/sources/:source/pause",
    auth: "admin",
    summary:
      "Pauses a source: no claims take its targets and no discovery cycle runs for it, on every server instance (within one second on instances other than the one asked). Active assignments run on. Audited.",
    body: AdminApi.WithReason,
    response: { status: 200, schema: AdminApi.SourceControlView },
    errors: ["400 `invalid_path` unknown source"]
  },
  {
    method: "POST",
    path: "/v1/admin/sources/:source/resume",
    auth: "admin",
    summary: "Resumes a paused source. Audited.",
    body: AdminApi.WithReason,
    response: { status: 200, schema: AdminApi.SourceControlView },
    errors: ["400 `invalid_path` unknown source"]
  },
  {
    method: "GET",
    path: "/v1/admin/devices",
    auth: "admin",
    summary: "Every device with its slots, claim filter, last contact (its newest claim, progress or result), active reservations and `containment`: the level its worker reported at registration (`pid-namespace`, `cgroup-v2`, `cgroup-v1-freezer` or `freeze-kill`; null before it registered), with `reportedAt`.",
    query: WorkerApi.EmptyQuery,
    response: { status: 200, schema: AdminApi.DeviceList }
  },
  {
    method: "POST",
    path: "/v1/admin/devices/:id/sources",
    auth: "admin",
    summary: "Restricts the sources a device may claim (`null`: all; `[]`: none, which drains the device while its active reservations finish; a source listed twice is a 400 at its second place). Claims obey it within one second on every instance. Audited.",
    body: AdminApi.DeviceSources,
    response: { status: 200, schema: AdminApi.DeviceDetailView },
    errors: ["404 no such device"]
  },
  {
    method: "DELETE",
    path: "/v1/admin/devices/:id",
    auth: "admin",
    summary:
      "Revokes a device: its token stops working at once (401) and its active reservations end at once (fenced, their targets back to pending). `?reason=` is recorded in the audit log.",
    query: AdminApi.RevokeQuery,
    response: { status: 200, schema: AdminApi.Revoked },
    errors: ["404 no such device"]
  },
  {
    method: "GET",
    path: "/v1/admin/audit",
    auth: "admin",
    summary: "The audit log of operator actions (who, when, what, why, details), newest first; pass the last entry's `id` as `before` for older ones.",
    query: AdminApi.AuditQuery,
    response: { status: 200, schema: AdminApi.AuditList }
  }
] satisfies Array<Endpoint>).map(named)

/** Pages that are not JSON. */
export const other: ReadonlyArray<Endpoint> = [
  ...FindingReference.endpoints,
  {
    method: "GET",
    path: "/",
    auth: "admin (bearer or cookie)",
    summary:
      "The dashboard (server-rendered HTML, refreshes every 5 s). Without a session it answers 401 with a sign-in form (`POST /login`). `/?token=<admin token>` also signs in: the server sets the HTTP-only, SameSite=Strict cookie `scanfleet_admin` (a session value derived from the token, which opens the dashboard and not the admin API) and redirects to `/`, so the token leaves the address bar, but the browser's history keeps the address opened; the form keeps the token out of it. Takes the percentile query parameters (`source`, `metric`, `outcome`, `windowHours`).",
    response: { status: 200, note: "text/html; 401 page with the sign-in form without a session, 303 redirect after `?token=`" }
  },
  {
    method: "POST",
    path: "/login",
    auth: "none",
    summary:
      "The dashboard's sign-in form, `application/x-www-form-urlencoded` with one field `token`, the admin token (compared in constant time). A match sets the `scanfleet_admin` cookie and redirects (303) to `/`; a wrong, missing or repeated token is 401 with the form again. The token travels in the body, so no address or history holds it.",
    bodyLimit: `${maxFormBytes} bytes (413 beyond)`,
    response: { status: 303, note: "to `/`, with the session cookie" }
  },
  {
    method: "GET",
    path: "/console/targets",
    auth: "admin (bearer or cookie)",
    summary: "The operator console's target search (server-rendered HTML): source, status and identity prefix, keyset pages; identities are truncated with the full value on hover.",
    response: { status: 200, note: "text/html" }
  },
  {
    method: "GET",
    path: "/console/target",
    auth: "admin (bearer or cookie)",
    summary:
      "One target (`?source=&identity=`) with every lifecycle field and its assignments: the three labelled deadlines (the one that fires next in bold), the phase timeline as a bar (each segment's width the time spent in that phase, with a table of the same; read from the phase events alone, so recovered events are only counted), expiry evidence and cancellations; forms to requeue it and cancel an active assignment.",
    response: { status: 200, note: "text/html" }
  },
  {
    method: "GET",
    path: "/console/charts",
    auth: "admin (bearer or cookie)",
    summary:
      "Charts of assignments ended per hour over the last 24 h (completed, timed out, failed otherwise, expired: each counted once) with the targets promoted per hour, and of the p50/p95/p99 of one group (`?source=&metric=&outcome=`; unless all three are given, the busiest group of the span matching those that are) in consecutive windows (`?span=24h`: hourly over the last 24 h, the default; `7d`: 6-hourly over 7 days), each window read on its own, insufficient windows left as gaps; the page links every group with samples in the span. Drawn with uPlot served from `/assets/`; the same numbers are in tables for browsers without script.",
    response: { status: 200, note: "text/html" }
  },
  {
    method: "GET",
    path: "/assets/:name",
    auth: "none",
    summary: "The console's static files: `uplot.js` and `uplot.css` (the charting library, from the server's own dependencies; no CDN) and `console-charts.js`.",
    response: { status: 200, note: "text/javascript or text/css; 404 for any other name" }
  },
  { method: "GET", path: "/console/sources", auth: "admin (bearer or cookie)", summary: "Each source's controls, with pause and resume forms.", response: { status: 200, note: "text/html" } },
  {
    method: "GET",
    path: "/console/devices",
    auth: "admin (bearer or cookie)",
    summary: "Every device with its slots, the containment level its worker reported at registration (or `not reported yet`), last contact, active reservations, claim filter and state.",
    response: { status: 200, note: "text/html" }
  },
  {
    method: "POST",
    path: "/console/actions/:action",
    auth: "admin (bearer or cookie)",
    summary:
      `A console form's action (\`requeue\`, \`priority\` with its \`priority\` field, \`cancel\`, \`pause\`, \`resume\`), as \`application/x-www-form-urlencoded\` with \`csrf\` (the token the page embeds, bound to the dashboard session), \`reason\` (audited, actor \`dashboard\`), \`back\` (the console page to return to) and the subject's fields. Answers 303 to \`back\` with \`done=\` or \`refused=\` (its message cut to 200 characters); a missing or wrong CSRF token gets 403; with the token, a field that is missing, unknown, repeated, or breaks its limit (the JSON API's string and identity limits, \`back\` a console page) gets 400 naming it; a form over ${maxFormBytes.toLocaleString("en-US")} bytes gets 413 as soon as the limit is crossed. A refusal changes nothing.`,
    response: { status: 303, note: "redirect; an HTML page with 403 when the CSRF check fails, 400 for a field at fault, 413 for a form over its limit" }
  },
  { method: "GET", path: "/metrics", auth: "none", summary: "Prometheus text exposition (see docs/server.md for the metric names).", response: { status: 200, note: "text/plain; version=0.0.4" } },
  {
    method: "GET",
    path: "/healthz",
    auth: "none",
    summary: "Liveness: `{ \"ok\": true, \"status\": \"alive\" }` while the process serves requests. It checks nothing else, so a liveness probe restarts only a hung process, never one waiting for its database.",
    response: { status: 200 }
  },
  {
    method: "GET",
    path: "/readyz",
    auth: "none",
    summary:
      "Readiness: 200 when the database answers within 2 s, its schema is at the newest migration this build knows, and the expiry sweeper finished a sweep within three sweep intervals plus 5 s; else 503. On PostgreSQL, when every pooled connection is in use the database is asked on a connection of the probe's own: if it answers, the check is `answers; busy: ...` and the server stays ready (the schema as last read; the sweeper needs only to have tried a sweep); a database that cannot be reached or does not answer is 503 `unreachable`. Each check is listed with what it found. Point load balancers and orchestrator readiness probes here.",
    response: { status: 200, schema: AdminApi.Readiness, note: "503 with the same body when a check fails" }
  }
]

const schemaBlock = (title: string, schema: z.ZodType, io: "input" | "output") =>
  `${title}\n\n\`\`\`json\n${JSON.stringify(z.toJSONSchema(schema, { io, unrepresentable: "any" }), null, 2)}\n\`\`\`\n`

const section = (e: Endpoint) => {
  const parts = [`## \`${e.method} ${e.path}\`\n`, `${e.summary}\n`, `- Auth: ${e.auth}`]
  if (e.body) parts.push(`- Body limit: ${e.bodyLimit ?? "the server's `maxBodyBytes` (default 262144 bytes)"}`)
  for (const [h, max] of Object.entries(e.headers ?? {})) parts.push(`- Header \`${h}\`: optional, at most ${max} characters, no control characters`)
  if (e.response) parts.push(`- Success: ${e.response.status}${e.response.note ? ` (${e.response.note})` : ""}`)
  for (const err of e.errors ?? []) parts.push(`- Refusal: ${err}`)
  parts.push("")
  if (e.query) parts.push(schemaBlock("Query string:", e.query, "input"))
  if (e.body) parts.push(schemaBlock("Request body:", e.body, "input"))
  if (e.example !== undefined) parts.push(`Example body:\n\n\`\`\`json\n${JSON.stringify(e.example, null, 2)}\n\`\`\`\n`)
  if (e.response?.schema) parts.push(schemaBlock(`Response body (${e.response.status}):`, e.response.schema, "output"))
  return parts.join("\n")
}

const header = (title: string) =>
  `<!-- Generated from the zod schemas in packages/core/src/WorkerApi.ts and AdminApi.ts by packages/server-example/src/ApiReference.ts; test/ApiReference.test.ts fails when this file is stale (SCANFLEET_UPDATE_DOCS=1 rewrites it). -->\n\n# ${title}\n`

const index = () => `${header("HTTP API reference")}
Every endpoint is versioned under \`/v1\`, takes and returns JSON, and is described by a zod schema exported from \`@scanfleet/core\` (\`WorkerApi\`, \`AdminApi\`), so the worker client, third-party clients and the server share one contract.

- [Worker API](worker-api.md): what devices call, with a device bearer token.
- [Admin API](admin-api.md): what operators call, with the admin token.

## Authentication

- Devices send \`Authorization: Bearer <device token>\`. A token is 32 random bytes (\`sfd_\` + base64url), shown once by \`POST /v1/admin/devices\` or \`scanfleet-server device add\`; the server stores only its SHA-256.
- Operators send \`Authorization: Bearer <admin token>\` (the server setting \`adminToken\` / \`SCANFLEET_ADMIN_TOKEN\`), compared in constant time.
- 401: no token, an unknown or revoked one, or a wrong admin token. 403: a valid token of the wrong role (a device token on \`/v1/admin/*\`, the admin token on the Worker API) or another device's reservation. A refused request changes nothing.

## Errors

Every refusal has this body; \`issues\` names the field at fault where there is one (an unknown field is reported at its own path), and \`holder\` the caller's own reservation that holds the slot a claim asked for (\`claim_rejected:slot_busy\`).

${schemaBlock("Error body:", WorkerApi.ErrorBodySchema, "output")}
| status | \`error\` | when |
| --- | --- | --- |
| 400 | \`malformed_json\`, \`too_deep\`, \`invalid_body\`, \`invalid_query\`, \`invalid_path\`, \`invalid_header\` | the body is not JSON or nests too deep, or a body, query, path or header value does not match its schema or breaks a limit below |
| 400 | \`body_unreadable\` | the connection failed while the body was being read |
| 400 | \`bad_request\` | Node's HTTP parser refused the request before any handler ran (a malformed request line, header or chunk, \`Content-Length\` with \`Transfer-Encoding\`, an invalid or repeated \`Content-Length\`, a raw space or non-ASCII byte in the target), or it is a \`CONNECT\` or an HTTP/1.1 request without \`Host\`; answered with \`Connection: close\` |
| 400 | \`store_invalid\` | the database refused a value of the request that the limits below let through (a character or length it cannot store); retrying will not help |
| 401 | \`unauthorized\` | missing or wrong credentials |
| 403 | \`forbidden\`, \`reservation_refused:<reason>\` | wrong role; the reservation is not the caller's live one (\`not_owner\`, \`stale_fence\`, \`expired\`, \`not_active\`, \`cancelled\`, \`upload_deadline_passed\`) |
| 404 | \`not_found\`, \`route_not_found\` | no such entity or endpoint |
| 408 | \`request_timeout\` | the request was not received in full within the server's request timeout (60 s); answered with \`Connection: close\` |
| 409 | \`claim_rejected:<reason>\`, \`operation_refused:<reason>\` | the claim could not take authority (\`slot_busy\`, \`capacity\`, \`source_cap\`, \`deadline_passed\`, ...); an operator action does not apply to the subject as it stands |
| 409 | \`store_constraint\` | the request breaks a constraint of the stored data |
| 413 | \`payload_too_large\` | the body exceeds its limit |
| 417 | \`expectation_failed\` | an \`Expect\` header other than \`100-continue\` |
| 422 | \`progress_rejected:<reason>\`, \`invalid_config\` | a progress batch contradicts the timeline; a configuration breaks a rule |
| 431 | \`headers_too_large\` | the request line and headers exceed Node's \`maxHeaderSize\` (16384 bytes unless the server runs with \`--max-http-header-size\`); answered with \`Connection: close\` |
| 500 | \`store_corrupt\`, \`store_internal\`, \`internal\` | the database file is damaged, or a server defect (the log has the detail) |
| 503 | \`store_unavailable\`, \`store_full\`, \`store_busy\` | the database cannot be reached or is read-only (a standby; the message says which), is out of space or memory, or stayed locked past the server's retries; the \`Retry-After\` header says when to retry (5, 30 and 1 s) |
| 503 | \`shutting_down\` | the server is stopping: a request that arrived after it stopped handling new ones, answered with \`Retry-After: 1\` and \`Connection: close\`; retry it (on another instance, or once this one is back) |

## Limits

Every string that crosses the HTTP edge is refused with 400 and the path of the string when it holds a NUL character (U+0000) or an unpaired UTF-16 surrogate, or exceeds its length: the field's own \`maxLength\` in the schemas below, else ${WorkerApi.maxStringLength} characters for a string and ${WorkerApi.maxKeyLength} for an object key anywhere in a JSON body (findings included), and ${WorkerApi.maxQueryLength} for a query-string key or value. So nothing reaches the database that it would refuse or store differently.

- JSON bodies nest arrays and objects at most ${WorkerApi.maxJsonDepth} levels deep (the body itself is level 1); deeper is 400 \`too_deep\`, refused before the body is parsed.
- A body over its limit (\`Body limit\` of each endpoint) is answered 413 as soon as the limit is crossed, whether it declares a \`Content-Length\` or is sent chunked; the rest is not read and the connection is closed.
- A path id is exactly one segment of digits without a leading zero (at most 15): \`1;x\`, \`1/\`, \`01\` or \`1%3B\` get 400 \`invalid_path\`, never the resource \`1\`. Every path parameter (\`:source\` too) is the whole segment as sent, in a path with nothing after its route (not even a trailing \`/\`): a segment holding \`;\` or \`#\`, or whose percent-encoding is not UTF-8, gets 400 \`invalid_path\` at the parameter, whatever follows it.
- An endpoint under \`/v1\` whose reference shows no query string takes none: any query key is 400 \`invalid_query\` at the key, as the endpoints that read a query refuse an unknown or repeated one.
- A number in a query (\`limit\`, \`after\`, \`before\`, \`windowHours\`) is written in decimal digits and nothing else: \`1e3\`, \` 1\`, \`0x10\`, \`+1\`, \`1.0\` for an integer, and an empty value get 400 \`invalid_query\` at the field.
- A query is read as a form (\`+\` is a space, \`%XX\` a byte), and its bytes must be UTF-8: a key or value that is not, once percent-decoded (\`prefix=%FF\`), is 400 \`invalid_query\` at its key, never read as replacement characters.

Each core error class maps to one status: \`ClaimRejected\` 409, \`ReservationRefused\` 403, \`ProgressRejected\` 422, \`NotFound\` 404.

## Endpoints

| method | path | auth |
| --- | --- | --- |
${[...worker, ...admin, ...operations, ...other].map((e) => `| ${e.method} | \`${e.path}\` | ${e.auth} |`).join("\n")}

${other.map(section).join("\n")}`

/** The reference pages, file name to content, as checked in under `docs/api/`. */
export const render = (): Record<string, string> => ({
  "index.md": index(),
  "worker-api.md": `${header("Worker API")}\nAll endpoints take \`Authorization: Bearer <device token>\`. Errors: see [index.md](index.md#errors).\n\n${worker.map(section).join("\n")}`,
  "admin-api.md": `${header("Admin API")}\nAll endpoints take \`Authorization: Bearer <admin token>\`. Errors: see [index.md](index.md#errors).\n\n${admin.map(section).join("\n")}\n## Operator endpoints\n\nEvery change is recorded in the audit log: the \`X-Scanfleet-Actor\` header names who (default \`admin\`), the body's \`reason\` says why.\n\n${operations.map(section).join("\n")}`
})
