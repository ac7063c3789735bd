import { HttpRouter, HttpServerRequest, HttpServerResponse } from "@effect/platform"
import { Deadline, Promotion, Store, WorkerApi } from "@scanfleet/core"
import { Clock, Effect } from "effect"
import type { z } from "zod"
import * as AdminRoutes from "./AdminRoutes.js"
import { ApiError, fromStoreError } from "./ApiError.js"
import * as Auth from "./Auth.js"
import * as FindingsPanel from "./FindingsPanel.js"
import * as Request from "./internal/Request.js"
import * as Url from "./internal/Url.js"
import { Settings } from "./ServerConfig.js"
import * as Tokens from "./Tokens.js"
import * as Views from "./Views.js"

const esc = (s: unknown): string =>
  String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!)

/** A duration as `1h 02m 03s`; negative durations read "passed". */
export const formatRemaining = (ms: number): string => {
  if (ms <= 0) return "passed"
  const s = Math.floor(ms / 1000)
  const h = Math.floor(s / 3600)
  const m = Math.floor((s % 3600) / 60)
  const sec = s % 60
  return h > 0 ? `${h}h ${String(m).padStart(2, "0")}m ${String(sec).padStart(2, "0")}s` : m > 0 ? `${m}m ${String(sec).padStart(2, "0")}s` : `${sec}s`
}

const iso = (ms: number | null) => (ms === null ? "—" : new Date(ms).toISOString())

const quantile = (q: z.infer<typeof WorkerApi.QuantileView>) =>
  q.status === "ok" ? `${Math.round(q.value)} ms` : `insufficient (${q.count} of ${q.required} samples)`

/** Headers of every dashboard page: not cached, not framed, no script at all. */
const secured = (res: HttpServerResponse.HttpServerResponse) =>
  res.pipe(
    HttpServerResponse.setHeaders({
      "cache-control": "no-store",
      "x-content-type-options": "nosniff",
      "referrer-policy": "no-referrer",
      "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"
    })
  )

const page = (title: string, body: string) => `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>${esc(title)}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#222}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0}th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f3f3}td[data-testid$="-at"],td[data-testid*="deadline"],td[data-testid*="expiry"],td[data-testid*="progress"]{white-space:nowrap}.num{text-align:right}.insufficient{color:#a35a00;font-style:italic}.next{font-weight:bold}
.id{display:inline-block;max-width:28ch;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;vertical-align:bottom}nav a{margin-right:1rem}
.muted{color:#777}dl.summary{display:grid;grid-template-columns:repeat(6,auto);gap:.25rem 1rem;width:max-content}dl.summary dt{color:#555}dl.summary dd{margin:0;font-weight:bold}
</style></head><body>${body}</body></html>`

const deadlineCell = (a: WorkerApi.AssignmentView, key: "targetScan" | "resultUpload" | "assignmentExpiry", testid: string) => {
  const d = a.deadlines[key]
  const isNext = a.nextDeadline?.which === key
  return `<td data-testid="${testid}" class="${isNext ? "next" : ""}"><span data-testid="${testid}-at">${esc(d.iso)}</span><br><span class="muted" data-testid="${testid}-remaining">${esc(formatRemaining(d.at - a.serverNow))}</span></td>`
}

const activeTable = (rows: ReadonlyArray<WorkerApi.AssignmentView>) =>
  rows.length === 0
    ? `<p data-testid="active-empty">No active reservations.</p>`
    : `<table data-testid="active-table"><thead><tr><th>Reservation</th><th>Target</th><th>Device / slot</th><th>Current phase</th>
<th>${esc(cap(Deadline.labels.scanDeadline))}</th><th>${esc(cap(Deadline.labels.uploadDeadline))}</th><th>${esc(cap(Deadline.labels.expiresAt))}</th>
<th>Fires next</th><th>Time remaining (until it fires)</th><th>Policy</th></tr></thead><tbody>
${rows
  .map((a) => {
    const id = a.reservationId
    return `<tr data-testid="active-row-${id}"><td>${id}</td><td><a href="/console/target?${esc(new URLSearchParams({ source: a.target.source, identity: a.target.identity }).toString())}"><span class="id" title="${esc(`${a.target.source}:${a.target.identity}`)}" data-testid="active-${id}-target">${esc(`${a.target.source}:${a.target.identity}`)}</span></a></td>
<td>${a.deviceId} / ${a.slot}</td><td data-testid="active-${id}-phase">${esc(a.lastPhase ?? "none yet")}</td>
${deadlineCell(a, "targetScan", `active-${id}-target-scan-deadline`)}${deadlineCell(a, "resultUpload", `active-${id}-result-upload-deadline`)}${deadlineCell(a, "assignmentExpiry", `active-${id}-assignment-expiry`)}
<td data-testid="active-${id}-next">${esc(a.nextDeadline ? a.nextDeadline.label : "all passed")}</td>
<td data-testid="active-${id}-remaining">${esc(a.nextDeadline ? formatRemaining(a.nextDeadline.remainingMs) : "passed")}</td>
<td data-testid="active-${id}-policy">${esc(`${a.policy.origin} TTL ${a.policy.ttlSeconds} s`)}</td></tr>`
  })
  .join("\n")}
</tbody></table>`

const cap = (s: string) => s[0].toUpperCase() + s.slice(1)

const expiredTable = (rows: ReadonlyArray<WorkerApi.AssignmentView>) =>
  rows.length === 0
    ? `<p data-testid="expired-empty">No expired assignments.</p>`
    : `<table data-testid="expired-table"><thead><tr><th>Reservation</th><th>Target</th><th>Device / slot</th><th>Last accepted phase</th><th>Last progress</th><th>${esc(cap(Deadline.labels.expiresAt))}</th><th>Expired at (sweep)</th></tr></thead><tbody>
${rows
  .map((a) => {
    const id = a.reservationId
    return `<tr data-testid="expired-row-${id}"><td>${id}</td><td><a href="/console/target?${esc(new URLSearchParams({ source: a.target.source, identity: a.target.identity }).toString())}"><span class="id" title="${esc(`${a.target.source}:${a.target.identity}`)}" data-testid="expired-${id}-target">${esc(`${a.target.source}:${a.target.identity}`)}</span></a></td><td>${a.deviceId} / ${a.slot}</td>
<td data-testid="expired-${id}-last-phase">${esc(a.expiry?.lastPhase ?? "none (no progress accepted)")}</td>
<td data-testid="expired-${id}-last-progress">${esc(iso(a.expiry?.lastProgressAt ?? null))}</td>
<td data-testid="expired-${id}-assignment-expiry">${esc(a.deadlines.assignmentExpiry.iso)}</td>
<td data-testid="expired-${id}-expired-at">${esc(iso(a.expiry?.expiredAt ?? null))}</td></tr>`
  })
  .join("\n")}
</tbody></table>`

// A cycle that queued nothing, deferred nothing and failed nothing carries no information: such rows are collapsed.
const quietCycle = (c: z.infer<typeof WorkerApi.CycleView>) => c.queuedNewCount === 0 && c.queuedUpdatedCount === 0 && c.deferredCount === 0 && c.error === null

const cycleRows = (rows: ReadonlyArray<z.infer<typeof WorkerApi.CycleView>>) =>
  rows
    .map(
      (c) => `<tr data-testid="cycle-row-${c.id}"><td>${c.id}</td><td data-testid="cycle-${c.id}-source">${esc(c.source)}</td><td>${esc(iso(c.startedAt))}</td><td>${esc(iso(c.endedAt))}</td>
<td class="num">${c.pages}</td><td class="num">${c.results}</td><td class="num">${c.malformed}</td>
<td class="num" data-testid="cycle-${c.id}-queued-new">${c.queuedNewCount}</td><td class="num" data-testid="cycle-${c.id}-queued-updated">${c.queuedUpdatedCount}</td>
<td class="num" data-testid="cycle-${c.id}-deferred">${c.deferredCount >= Promotion.deferredCountLimit ? `≥ ${Promotion.deferredCountLimit.toLocaleString("en-US")}` : c.deferredCount}</td><td data-testid="cycle-${c.id}-stop">${esc(c.stopReason)}</td><td>${esc(c.error ?? "")}</td></tr>`
    )
    .join("\n")

const cycleHead = `<thead><tr><th>Cycle</th><th>Source</th><th>Started</th><th>Ended</th><th>Pages</th><th>Results</th><th>Malformed</th>
<th>queued_new_count</th><th>queued_updated_count</th><th>Deferred by budget</th><th>Stop reason</th><th>Error</th></tr></thead>`

const cyclesTable = (rows: ReadonlyArray<z.infer<typeof WorkerApi.CycleView>>) => {
  if (rows.length === 0) return `<p data-testid="cycles-empty">No discovery cycles recorded yet.</p>`
  const told = rows.filter((c) => !quietCycle(c))
  const quiet = rows.filter(quietCycle)
  return (
    `<table data-testid="cycles-table">${cycleHead}<tbody>\n${cycleRows(told)}\n</tbody></table>` +
    (quiet.length === 0
      ? ""
      : `<details data-testid="cycles-collapsed"><summary>${quiet.length} cycle(s) that queued, deferred and failed nothing</summary><table>${cycleHead}<tbody>\n${cycleRows(quiet)}\n</tbody></table></details>`)
  )
}

const pctHead = `<thead><tr><th>Source</th><th>Metric</th><th>Outcome</th><th>Samples</th><th>p50</th><th>p95</th><th>p99</th></tr></thead>`

const pctRows = (rows: z.infer<typeof WorkerApi.PercentileResponse>["rows"]) =>
  rows
    .map((r) => {
      const k = `${r.source}-${r.metric}-${r.outcome}`
      const cell = (name: "p50" | "p95" | "p99") =>
        `<td data-testid="pct-${k}-${name}" class="num ${r[name].status === "insufficient" ? "insufficient" : ""}">${esc(quantile(r[name]))}</td>`
      return `<tr data-testid="pct-row-${k}"><td>${esc(r.source)}</td><td>${esc(r.metric)}</td><td>${esc(r.outcome)}</td><td class="num" data-testid="pct-${k}-count">${r.count}</td>${cell("p50")}${cell("p95")}${cell("p99")}</tr>`
    })
    .join("\n")

// Rows whose every percentile is insufficient say only their count: they are collapsed below the informative ones.
const percentileTable = (p: z.infer<typeof WorkerApi.PercentileResponse>) => {
  const head = `<p>Window: last <span data-testid="percentiles-window">${p.windowHours}</span> h; a percentile needs at least <span data-testid="percentiles-min-samples">${p.minSamples}</span> samples.</p>`
  if (p.rows.length === 0) return head + `<p data-testid="percentiles-empty">No duration observations in this window.</p>`
  const known = p.rows.filter((r) => r.p50.status === "ok" || r.p95.status === "ok" || r.p99.status === "ok")
  const thin = p.rows.filter((r) => !known.includes(r))
  return (
    head +
    `<table data-testid="percentiles-table">${pctHead}<tbody>\n${pctRows(known)}\n</tbody></table>` +
    (thin.length === 0
      ? ""
      : `<details data-testid="percentiles-collapsed"><summary>${thin.length} row(s) with fewer than ${p.minSamples} samples (insufficient)</summary><table>${pctHead}<tbody>\n${pctRows(thin)}\n</tbody></table></details>`)
  )
}

const summaryBlock = (s: z.infer<typeof WorkerApi.SummaryView>) => {
  const item = (label: string, testid: string, n: number) => `<dt>${esc(label)}</dt><dd data-testid="summary-${testid}">${n}</dd>`
  return `<dl class="summary" data-testid="summary">
${item("Targets queued new", "queued-new", s.targets.queuedNew)}${item("Targets queued updated", "queued-updated", s.targets.queuedUpdated)}${item("Pending", "pending", s.targets.pending)}
${item("Assignments running", "running", s.assignments.running)}${item("Completed", "completed", s.assignments.completed)}${item("Timed out", "timed-out", s.assignments.timedOut)}
${item("Failed", "failed", s.assignments.failed)}${item("Expired", "expired", s.assignments.expired)}${item("Released", "released", s.assignments.released)}
</dl>`
}

const targetsTable = (rows: ReadonlyArray<Store.TargetCount>) =>
  rows.length === 0
    ? `<p data-testid="targets-empty">No targets yet.</p>`
    : `<table data-testid="targets-table"><thead><tr><th>Source</th><th>Status</th><th>Targets</th></tr></thead><tbody>
${rows.map((r) => `<tr><td>${esc(r.source)}</td><td>${esc(r.status)}</td><td class="num" data-testid="targets-${r.source}-${r.status}">${r.count}</td></tr>`).join("\n")}
</tbody></table>`

const errorPage = (message: string, status: number) =>
  HttpServerResponse.html(
    page(
      "scanfleet dashboard",
      `<h1>scanfleet dashboard</h1><p data-testid="${status === 401 || status === 403 ? "auth-error" : "error"}">${esc(message)}</p>` +
        (status === 401 || status === 403
          ? `<p>Open <code>/?token=&lt;admin token&gt;</code> once; the token is then kept in an HTTP-only cookie and removed from the address.</p>`
          : `<p><a href="/">Back to the dashboard</a></p>`)
    )
  ).pipe(HttpServerResponse.setStatus(status), secured)

/**
 * GET /: the dashboard. `/?token=<admin token>` sets the admin cookie and
 * redirects to `/`, so the token leaves the address bar and the history.
 */
const dashboard = Effect.gen(function* () {
  const req = yield* HttpServerRequest.HttpServerRequest
  const url = Url.parse(req.url)
  const given = url.searchParams.get("token")
  if (given !== null) {
    const settings = yield* Settings
    if (!Tokens.equal(given, settings.adminToken)) return errorPage("The admin token is wrong.", 401)
    url.searchParams.delete("token")
    return HttpServerResponse.empty({ status: 303 }).pipe(
      HttpServerResponse.setHeader("location", `/${url.search}`),
      HttpServerResponse.unsafeSetCookie(Auth.adminCookie, Auth.dashboardSession(settings.adminToken), { httpOnly: true, sameSite: "strict", path: "/" })
    )
  }
  const authed = yield* Auth.admin({ cookie: true }).pipe(Effect.either)
  if (authed._tag === "Left") return errorPage(authed.left.message, authed.left.status)
  const q = yield* Request.query(WorkerApi.PercentileQuery)
  const store = yield* Store.Store
  const now = yield* Clock.currentTimeMillis
  const active = yield* store.listAssignments({ state: "active", limit: 500 }).pipe(Effect.mapError(fromStoreError))
  const expired = yield* store.listAssignments({ state: "expired", limit: 200 }).pipe(Effect.mapError(fromStoreError))
  const cycles = yield* store.listCycles({ limit: 50 }).pipe(Effect.mapError(fromStoreError))
  const counts = yield* store.countTargets().pipe(Effect.mapError(fromStoreError))
  const pct = yield* AdminRoutes.percentileData(q)
  const summary = yield* AdminRoutes.summaryData
  const fleet = yield* store.fleet().pipe(Effect.mapError(fromStoreError))
  const findings = yield* FindingsPanel.render
  const activeViews = active.map((a) => Views.assignment(a, now, fleet.id)).sort((a, b) => (a.nextDeadline?.at ?? Infinity) - (b.nextDeadline?.at ?? Infinity))
  const body = `<nav><a href="/console/targets" data-testid="nav-targets">Search targets</a><a href="/console/sources" data-testid="nav-sources">Pause or resume sources</a><a href="/console/devices" data-testid="nav-devices">Devices</a></nav><h1>scanfleet dashboard</h1>
<p class="muted">Server time <span data-testid="server-now">${esc(iso(now))}</span>; refreshes every 5 s. Every assignment carries three deadlines, fixed at issuance and never renewed:
the <b>${esc(Deadline.labels.scanDeadline)}</b> (the whole scan stage must end), the <b>${esc(Deadline.labels.uploadDeadline)}</b> (the result must be accepted),
and the <b>${esc(Deadline.labels.expiresAt)}</b> (the server reclaims the target). The one that fires next is in bold.</p>
<h2>Summary</h2>${summaryBlock(summary)}
<h2>Active reservations (<span data-testid="active-count">${active.length}</span>)</h2>${activeTable(activeViews)}
<h2>Expired assignments (<span data-testid="expired-count">${expired.length}</span>)</h2>${expiredTable(expired.map((a) => Views.assignment(a, now, fleet.id)))}
<h2>Discovery cycles</h2>${cyclesTable(cycles)}
<h2>Duration percentiles</h2>
<form method="get"><label>Source <select name="source"><option value="">all</option>${["github", "gitlab", "huggingface", "dockerhub"].map((s) => `<option${q.source === s ? " selected" : ""}>${s}</option>`).join("")}</select></label>
<label>Window (hours) <input name="windowHours" type="number" min="1" value="${esc(q.windowHours)}"></label> <button>Show</button></form>
${percentileTable(pct)}
<h2>Targets</h2>${targetsTable(counts)}
<h2>Findings</h2>${findings}`
  return secured(HttpServerResponse.html(page("scanfleet dashboard", body)))
}).pipe(
  Effect.catchTag("ApiError", (e: ApiError) =>
    Effect.succeed(errorPage(e.message, e.status))
  )
)

/** The dashboard route. */
export const router: HttpRouter.HttpRouter<ApiError, Store.Store | Settings> = HttpRouter.empty.pipe(HttpRouter.get("/", dashboard))
