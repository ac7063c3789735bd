import { WorkerApi } from "@scanfleet/core"
import { z } from "zod"
import * as FindingReference from "./FindingReference.js"

/** One endpoint of the HTTP API, with the zod schemas of what it takes and returns. */
export interface Endpoint {
  readonly method: "GET" | "POST" | "DELETE"
  readonly path: string
  readonly auth: "device" | "admin" | "admin (bearer or cookie)" | "none"
  readonly summary: string
  readonly query?: z.ZodType
  readonly body?: z.ZodType
  /** Body limit when it differs from the server's `maxBodyBytes`. */
  readonly bodyLimit?: string
  readonly response?: { readonly status: number; readonly schema?: z.ZodType; readonly note?: string }
  /** Refusals specific to this endpoint, besides the common ones. */
  readonly errors?: ReadonlyArray<string>
}

const Empty = z.object({}).strict()
const Revoked = z.object({ revoked: z.number().int() }).strict()

/** The Worker API: what devices call. */
export const worker: ReadonlyArray<Endpoint> = [
  {
    method: "POST",
    path: "/v1/assignments/claim",
    auth: "device",
    summary:
      "Claims the next pending target for one slot of the calling device. The assignment carries the three immutable deadlines (target-scan deadline, result-upload deadline, assignment expiry), which fires next, the effective policy of the target's source with its origin (override or global), and the covered remote timestamp. `assignment` is null when nothing is pending.",
    body: WorkerApi.ClaimRequest,
    response: { status: 200, schema: WorkerApi.ClaimResponse },
    errors: ["400 `slot` at or above the device's slot count", "409 `claim_rejected:slot_busy` | `claim_rejected:capacity` | `claim_rejected:source_cap`"]
  },
  {
    method: "POST",
    path: "/v1/assignments/:id/progress",
    auth: "device",
    summary:
      "Appends a batch of phase events to the caller's reservation, idempotently by sequence number: an already accepted sequence with the same content answers `duplicate` with its original `acceptedAt`. Progress never renews any deadline: `assignmentExpiry` is returned so a client can see it did not move.",
    body: WorkerApi.ProgressRequest,
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
    response: { status: 200, schema: WorkerApi.PreviewResponse },
    errors: ["422 `invalid_config` with one issue per violation, each at its field path with a sentence naming the fields to change"]
  },
  {
    method: "POST",
    path: "/v1/admin/config/apply",
    auth: "admin",
    summary: "Validates like preview and stores the document as the next version; an invalid document is refused whole. The optional `X-Scanfleet-Actor` header names who applied it (default `admin`). New assignments use it at once; issued ones keep their deadlines.",
    body: WorkerApi.ConfigDocument,
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
    summary: "Registers a device. The token is in this response only; the server keeps its SHA-256.",
    body: WorkerApi.DeviceCreate,
    response: { status: 201, schema: WorkerApi.DeviceCreated }
  },
  {
    method: "DELETE",
    path: "/v1/admin/devices/:id",
    auth: "admin",
    summary: "Revokes a device; its token stops working at once (401).",
    response: { status: 200, schema: Revoked },
    errors: ["404 no such device"]
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
      "p50/p95/p99 durations (milliseconds; linear interpolation, as PostgreSQL's `percentile_cont`, read from log-bucket counts: within 0.9% of it) by source, metric and outcome over the last `windowHours`, with sample counts. Below the configured `metrics.minSamples` a value is `{ status: \"insufficient\", count, required }` instead of a number. Within a source and outcome that has data, every metric is listed.",
    query: WorkerApi.PercentileQuery,
    response: { status: 200, schema: WorkerApi.PercentileResponse }
  },
  {
    method: "GET",
    path: "/v1/admin/summary",
    auth: "admin",
    summary: "The dashboard's headline numbers: targets queued new and updated (sums over the recorded cycles), pending, in progress, completed, failed; assignments running, completed, timed out (outcome `killed_at_deadline`), failed, expired, released.",
    query: Empty,
    response: { status: 200, schema: WorkerApi.SummaryView }
  }
]

/** Pages that are not JSON. */
export const other: ReadonlyArray<Endpoint> = [
  ...FindingReference.endpoints,
  {
    method: "GET",
    path: "/",
    auth: "admin (bearer or cookie)",
    summary:
      "The dashboard (server-rendered HTML, refreshes every 5 s). Open `/?token=<admin token>` once: the server sets the HTTP-only, SameSite=Strict cookie `scanfleet_admin` (a session value derived from the token, which opens the dashboard and not the admin API) and redirects to `/`, so the token leaves the address bar. Takes the percentile query parameters (`source`, `metric`, `outcome`, `windowHours`).",
    response: { status: 200, note: "text/html; 401 page without the token, 303 redirect after `?token=`" }
  },
  { method: "GET", path: "/metrics", auth: "none", summary: "Prometheus text exposition (see docs/server.md for the metric names).", response: { status: 200, note: "text/plain; version=0.0.4" } },
  { method: "GET", path: "/healthz", auth: "none", summary: "Liveness: `{ \"ok\": true }`.", response: { status: 200 } }
]

const schemaBlock = (title: string, schema: z.ZodType, io: "input" | "output") =>
  `${title}\n\n\`\`\`json\n${JSON.stringify(z.toJSONSchema(schema, { io, unrepresentable: "any" }), null, 2)}\n\`\`\`\n`

const section = (e: Endpoint) => {
  const parts = [`## \`${e.method} ${e.path}\`\n`, `${e.summary}\n`, `- Auth: ${e.auth}`]
  if (e.body) parts.push(`- Body limit: ${e.bodyLimit ?? "the server's `maxBodyBytes` (default 262144 bytes)"}`)
  if (e.response) parts.push(`- Success: ${e.response.status}${e.response.note ? ` (${e.response.note})` : ""}`)
  for (const err of e.errors ?? []) parts.push(`- Refusal: ${err}`)
  parts.push("")
  if (e.query) parts.push(schemaBlock("Query string:", e.query, "input"))
  if (e.body) parts.push(schemaBlock("Request body:", e.body, "input"))
  if (e.response?.schema) parts.push(schemaBlock(`Response body (${e.response.status}):`, e.response.schema, "output"))
  return parts.join("\n")
}

const header = (title: string) =>
  `<!-- Generated from the zod schemas in packages/core/src/WorkerApi.ts by packages/server-example/src/ApiReference.ts; test/ApiReference.test.ts fails when this file is stale (SCANFLEET_UPDATE_DOCS=1 rewrites it). -->\n\n# ${title}\n`

const index = () => `${header("HTTP API reference")}
Every endpoint is versioned under \`/v1\`, takes and returns JSON, and is described by a zod schema exported from \`@scanfleet/core\` (\`WorkerApi\`), so the worker client, third-party clients and the server share one contract.

- [Worker API](worker-api.md): what devices call, with a device bearer token.
- [Admin API](admin-api.md): what operators call, with the admin token.

## Authentication

- Devices send \`Authorization: Bearer <device token>\`. A token is 32 random bytes (\`sfd_\` + base64url), shown once by \`POST /v1/admin/devices\` or \`scanfleet-server device add\`; the server stores only its SHA-256.
- Operators send \`Authorization: Bearer <admin token>\` (the server setting \`adminToken\` / \`SCANFLEET_ADMIN_TOKEN\`), compared in constant time.
- 401: no token, an unknown or revoked one, or a wrong admin token. 403: a valid token of the wrong role (a device token on \`/v1/admin/*\`, the admin token on the Worker API) or another device's reservation. A refused request changes nothing.

## Errors

Every refusal has this body; \`issues\` names the field at fault where there is one (an unknown field is reported at its own path).

${schemaBlock("Error body:", WorkerApi.ErrorBodySchema, "output")}
| status | \`error\` | when |
| --- | --- | --- |
| 400 | \`malformed_json\`, \`invalid_body\`, \`invalid_query\`, \`invalid_path\` | the body is not JSON, or a body, query or path value does not match its schema |
| 401 | \`unauthorized\` | missing or wrong credentials |
| 403 | \`forbidden\`, \`reservation_refused:<reason>\` | wrong role; the reservation is not the caller's live one (\`not_owner\`, \`stale_fence\`, \`expired\`, \`not_active\`, \`upload_deadline_passed\`) |
| 404 | \`not_found\`, \`route_not_found\` | no such entity or endpoint |
| 409 | \`claim_rejected:<reason>\` | the claim could not take authority (\`slot_busy\`, \`capacity\`, \`source_cap\`, ...) |
| 413 | \`payload_too_large\` | the body exceeds its limit |
| 422 | \`progress_rejected:<reason>\`, \`invalid_config\` | a progress batch contradicts the timeline; a configuration breaks a rule |
| 503 | \`store_unavailable\` | the database cannot be reached; retry |

Each core error class maps to one status: \`ClaimRejected\` 409, \`ReservationRefused\` 403, \`ProgressRejected\` 422, \`NotFound\` 404.

## Endpoints

| method | path | auth |
| --- | --- | --- |
${[...worker, ...admin, ...other].map((e) => `| ${e.method} | \`${e.path}\` | ${e.auth} |`).join("\n")}

${other.map(section).join("\n")}`

/** The reference pages, file name to content, as checked in under `docs/api/`. */
export const render = (): Record<string, string> => ({
  "index.md": index(),
  "worker-api.md": `${header("Worker API")}\nAll endpoints take \`Authorization: Bearer <device token>\`. Errors: see [index.md](index.md#errors).\n\n${worker.map(section).join("\n")}`,
  "admin-api.md": `${header("Admin API")}\nAll endpoints take \`Authorization: Bearer <admin token>\`. Errors: see [index.md](index.md#errors).\n\n${admin.map(section).join("\n")}`
})
