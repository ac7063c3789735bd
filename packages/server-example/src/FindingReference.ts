import { FindingsApi } from "@scanfleet/core"
import { z } from "zod"
import type { Endpoint } from "./ApiReference.js"

const DeadLetters = z
  .object({ subscriber: z.string(), deadLetters: z.array(z.object({ seq: z.number().int(), attempts: z.number().int(), lastError: z.string(), at: z.number().int() }).strict()) })
  .strict()

/** The findings endpoints (admin reads, exports and webhook dead letters; the device's fleet key). */
export const endpoints: ReadonlyArray<Endpoint> = [
  {
    method: "GET",
    path: "/v1/device/fleet-key",
    auth: "device",
    summary: "The fleet key devices fingerprint secrets with (HMAC-SHA256), derived from the server's `findingsKey` setting; never stored in the database. See docs/findings.md.",
    response: { status: 200, schema: FindingsApi.FleetKey },
    errors: ["403 the admin token cannot act as a device"]
  },
  {
    method: "GET",
    path: "/v1/admin/findings",
    auth: "admin (bearer or cookie)",
    summary: "Findings in id order with filters (source, identity, detector, status new/open/resolved, verified, since) and keyset pagination: pass the answer's `next` as `after` for the following page.",
    query: FindingsApi.ListQuery,
    response: { status: 200, schema: FindingsApi.Page },
    errors: ["501 `findings_unavailable`: the server's store keeps no findings"]
  },
  {
    method: "GET",
    path: "/v1/admin/findings/target",
    auth: "admin (bearer or cookie)",
    summary:
      "One target's findings, the changes in their lives (new, reopened, resolved, with the revision) and its scans with their summaries (new, still present, resolved), a keyset page at a time: at most `limit` findings (default 100, at most 1000) in id order, each page with the newest 20 events of each of its findings (`moreEvents` lists those with older ones: read them from their history), and at most `limit` scans in reservation order. The first page (no cursor) starts both lists; pass the answer's `next` as `after` for the following findings (that page carries no scans) and `nextScans` as `scansAfter` for the following scans (no findings); each is null on its list's last page. A cursor past the end is an empty page, not a 404.",
    query: FindingsApi.TargetQuery,
    response: { status: 200, schema: FindingsApi.TargetHistory },
    errors: ["404 the target has no findings and no related scan"]
  },
  {
    method: "GET",
    path: "/v1/admin/findings/:id/history",
    auth: "admin (bearer or cookie)",
    summary:
      "One finding's changes (new, reopened, resolved, with the revision) in the order they happened, a keyset page at a time: at most `limit` (default 100, at most 1000); pass the answer's `next` as `after` for the following page (null on the last). A cursor past the end is an empty page, not a 404.",
    query: FindingsApi.HistoryQuery,
    response: { status: 200, schema: FindingsApi.History },
    errors: ["404 no such finding"]
  },
  {
    method: "GET",
    path: "/v1/admin/findings/export",
    auth: "admin",
    summary: "The filtered findings as JSON lines (`application/x-ndjson`, one finding per line) or a SARIF 2.1.0 log (`application/sarif+json`), at most 100,000 (a trailer line or run property says when the export was cut).",
    query: FindingsApi.ExportQuery,
    response: { status: 200, note: "JSON lines or SARIF 2.1.0" }
  },
  {
    method: "GET",
    path: "/v1/admin/findings/scans/:id",
    auth: "admin (bearer or cookie)",
    summary: "The summary of the scan a reservation delivered: how many findings were new, still present and resolved (zeros and `related: false` when it touched none).",
    response: { status: 200, schema: FindingsApi.ScanView.partial().extend({ related: z.boolean().optional() }) }
  },
  {
    method: "GET",
    path: "/v1/admin/findings/webhook/dead-letters",
    auth: "admin",
    summary: "The outbox events the webhook could not deliver within its tries, oldest first.",
    response: { status: 200, schema: DeadLetters },
    errors: ["501 `webhook_unconfigured`: no `webhookUrl` is set"]
  },
  {
    method: "POST",
    path: "/v1/admin/findings/webhook/dead-letters/:seq/redeliver",
    auth: "admin",
    summary: "Takes one dead letter off the list and delivers its event again, with a fresh budget of tries (it returns to the list if they run out).",
    response: { status: 202, schema: z.object({ redelivering: z.number().int() }).strict() },
    errors: ["404 no such dead letter", "501 `webhook_unconfigured`"]
  }
]
