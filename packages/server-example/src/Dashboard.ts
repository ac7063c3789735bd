import { HttpRouter, HttpServerRequest, HttpServerResponse } from "@effect/platform"
import { Deadline, Promotion, Source, Store, WorkerApi } from "@scanfleet/core"
import { Clock, Effect } from "effect"
import type { z } from "zod"
import * as AdminRoutes from "./AdminRoutes.js"
import { ApiError, fromStoreError } from "./ApiError.js"
import * as Auth from "./Auth.js"
import { eta, maxFormBytes } from "./Console.js"
import * as FindingsPanel from "./FindingsPanel.js"
import * as Request from "./internal/Request.js"
import * as Url from "./internal/Url.js"
import { Settings } from "./ServerConfig.js"
import * as Tokens from "./Tokens.js"
import * as Views from "./Views.js"

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

const cap = (s: string) => s[0].toUpperCase() + s.slice(1)

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

const css = `body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#222}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0}th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.when{white-space:nowrap}.num{text-align:right}.insufficient{color:#a35a00;font-style:italic}.next{font-weight:bold}
.id{display:inline-block;max-width:28ch;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;vertical-align:bottom}nav a{margin-right:1rem}
.muted{color:#777}dl.summary{display:grid;grid-template-columns:repeat(6,auto);gap:.25rem 1rem;width:max-content}dl.summary dt{color:#555}dl.summary dd{margin:0;font-weight:bold}`

// The dashboard's templates: every `<%= %>` value is escaped by the engine; `<%~ %>` only inserts
// another template's output or the fixed style sheet.
eta.loadTemplate(
  "@dashboard-layout",
  `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><% if (it.refresh) { %><meta http-equiv="refresh" content="5"><% } %>
<title><%= it.title %></title><style><%~ it.css %></style></head><body><%~ it.body %></body></html>`
)

eta.loadTemplate(
  "@dashboard-error",
  `<h1>scanfleet dashboard</h1><p data-testid="<%= it.testid %>"><%= it.message %></p>
<% if (it.auth) { %><form method="post" action="/login" data-testid="sign-in"><label>Admin token <input type="password" name="token" autocomplete="current-password" required></label> <button type="submit">Sign in</button></form>
<p class="muted">The token is then kept as a session in an HTTP-only cookie. (<code>/?token=&lt;admin token&gt;</code> works too, but the browser's history keeps the address you open.)</p><% } else { %><p><a href="/">Back to the dashboard</a></p><% } %>`
)

eta.loadTemplate(
  "@deadline-cell",
  `<td data-testid="<%= it.testid %>" class="when<%= it.next ? " next" : "" %>"><span data-testid="<%= it.testid %>-at"><%= it.iso %></span><br><span class="muted" data-testid="<%= it.testid %>-remaining"><%= it.remaining %></span></td>`
)

eta.loadTemplate(
  "@dashboard-cycles",
  `<table<%~ it.testid ? ' data-testid="cycles-table"' : "" %>><thead><tr><th>Cycle</th><th>Source</th><th>Started</th><th>Ended</th><th>Pages</th><th>Results</th><th>Malformed</th>
<th>queued_new_count</th><th>queued_updated_count</th><th>Deferred by budget</th><th>Stop reason</th><th>Error</th></tr></thead><tbody>
<% for (const c of it.rows) { %><tr data-testid="cycle-row-<%= c.id %>"><td><%= c.id %></td><td data-testid="cycle-<%= c.id %>-source"><%= c.source %></td><td class="when"><%= c.started %></td><td class="when"><%= c.ended %></td>
<td class="num"><%= c.pages %></td><td class="num"><%= c.results %></td><td class="num"><%= c.malformed %></td>
<td class="num" data-testid="cycle-<%= c.id %>-queued-new"><%= c.queuedNew %></td><td class="num" data-testid="cycle-<%= c.id %>-queued-updated"><%= c.queuedUpdated %></td>
<td class="num" data-testid="cycle-<%= c.id %>-deferred"><%= c.deferred %></td><td data-testid="cycle-<%= c.id %>-stop"><%= c.stop %></td><td><%= c.error %></td></tr>
<% } %></tbody></table>`
)

eta.loadTemplate(
  "@dashboard-percentiles",
  `<table<%~ it.testid ? ' data-testid="percentiles-table"' : "" %>><thead><tr><th>Source</th><th>Metric</th><th>Outcome</th><th>Samples</th><th>p50</th><th>p95</th><th>p99</th></tr></thead><tbody>
<% for (const r of it.rows) { %><tr data-testid="pct-row-<%= r.key %>"><td><%= r.source %></td><td><%= r.metric %></td><td><%= r.outcome %></td><td class="num" data-testid="pct-<%= r.key %>-count"><%= r.count %></td>
<% for (const q of r.cells) { %><td data-testid="pct-<%= r.key %>-<%= q.name %>" class="num<%= q.insufficient ? " insufficient" : "" %>"><%= q.text %></td><% } %></tr>
<% } %></tbody></table>`
)

eta.loadTemplate(
  "@dashboard",
  `<nav><a href="/console/targets" data-testid="nav-targets">Search targets</a><a href="/console/sources" data-testid="nav-sources">Pause or resume sources</a><a href="/console/devices" data-testid="nav-devices">Devices</a><a href="/console/charts" data-testid="nav-charts">Charts</a></nav><h1>scanfleet dashboard</h1>
<p class="muted">Server time <span data-testid="server-now"><%= it.now %></span>; refreshes every 5 s. Every assignment carries three deadlines, fixed at issuance and never renewed:
the <b><%= it.labels.scan %></b> (the whole scan stage must end), the <b><%= it.labels.upload %></b> (the result must be accepted),
and the <b><%= it.labels.expiry %></b> (the server reclaims the target). The one that fires next is in bold.</p>
<h2>Summary</h2>
<dl class="summary" data-testid="summary"><% for (const i of it.summary) { %><dt><%= i.label %></dt><dd data-testid="summary-<%= i.testid %>"><%= i.n %></dd><% } %></dl>
<p class="muted">Each ended assignment is counted once: killed at a deadline is <i>timed out</i>, not also <i>failed</i>.</p>
<h2>Active reservations (<span data-testid="active-count"><%= it.active.length %></span>)</h2>
<% if (it.active.length === 0) { %><p data-testid="active-empty">No active reservations.</p><% } else { %>
<table data-testid="active-table"><thead><tr><th>Reservation</th><th>Target</th><th>Device / slot</th><th>Current phase</th>
<th><%= it.heads.scan %></th><th><%= it.heads.upload %></th><th><%= it.heads.expiry %></th>
<th>Fires next</th><th>Time remaining (until it fires)</th><th>Policy</th></tr></thead><tbody>
<% for (const a of it.active) { %><tr data-testid="active-row-<%= a.id %>"><td><%= a.id %></td><td><a href="<%= a.href %>"><%~ include("@identity", { source: a.source, id: a.identity, testid: "active-" + a.id + "-target" }) %></a></td>
<td><%= a.device %> / <%= a.slot %></td><td data-testid="active-<%= a.id %>-phase"><%= a.phase %></td>
<% for (const d of a.deadlines) { %><%~ include("@deadline-cell", d) %><% } %>
<td data-testid="active-<%= a.id %>-next"><%= a.next %></td>
<td data-testid="active-<%= a.id %>-remaining"><%= a.remaining %></td>
<td data-testid="active-<%= a.id %>-policy"><%= a.policy %></td></tr>
<% } %></tbody></table><% } %>
<h2>Expired assignments (<span data-testid="expired-count"><%= it.expired.length %></span>)</h2>
<% if (it.expired.length === 0) { %><p data-testid="expired-empty">No expired assignments.</p><% } else { %>
<table data-testid="expired-table"><thead><tr><th>Reservation</th><th>Target</th><th>Device / slot</th><th>Last accepted phase</th><th>Last progress</th><th><%= it.heads.expiry %></th><th>Expired at (sweep)</th></tr></thead><tbody>
<% for (const a of it.expired) { %><tr data-testid="expired-row-<%= a.id %>"><td><%= a.id %></td><td><a href="<%= a.href %>"><%~ include("@identity", { source: a.source, id: a.identity, testid: "expired-" + a.id + "-target" }) %></a></td><td><%= a.device %> / <%= a.slot %></td>
<td data-testid="expired-<%= a.id %>-last-phase"><%= a.lastPhase %></td>
<td class="when" data-testid="expired-<%= a.id %>-last-progress"><%= a.lastProgress %></td>
<td class="when" data-testid="expired-<%= a.id %>-assignment-expiry"><%= a.expiresAt %></td>
<td class="when" data-testid="expired-<%= a.id %>-expired-at"><%= a.expiredAt %></td></tr>
<% } %></tbody></table><% } %>
<h2>Discovery cycles</h2>
<% if (it.cycles.told.length + it.cycles.quiet.length === 0) { %><p data-testid="cycles-empty">No discovery cycles recorded yet.</p><% } else { %>
<%~ include("@dashboard-cycles", { rows: it.cycles.told, testid: true }) %>
<% if (it.cycles.quiet.length > 0) { %><details data-testid="cycles-collapsed"><summary><%= it.cycles.quiet.length %> cycle(s) that queued, deferred and failed nothing</summary><%~ include("@dashboard-cycles", { rows: it.cycles.quiet, testid: false }) %></details><% } %>
<% } %>
<h2>Duration percentiles</h2>
<form method="get"><label>Source <select name="source"><option value="">all</option><% for (const s of it.sources) { %><option<%= s === it.q.source ? " selected" : "" %>><%= s %></option><% } %></select></label>
<label>Window (hours) <input name="windowHours" type="number" min="1" value="<%= it.q.windowHours %>"></label> <button>Show</button></form>
<p>Window: last <span data-testid="percentiles-window"><%= it.pct.windowHours %></span> h; a percentile needs at least <span data-testid="percentiles-min-samples"><%= it.pct.minSamples %></span> samples. <a href="/console/charts">Percentiles per window</a></p>
<% if (it.pct.known.length + it.pct.thin.length === 0) { %><p data-testid="percentiles-empty">No duration observations in this window.</p><% } else { %>
<%~ include("@dashboard-percentiles", { rows: it.pct.known, testid: true }) %>
<% if (it.pct.thin.length > 0) { %><details data-testid="percentiles-collapsed"><summary><%= it.pct.thin.length %> row(s) with fewer than <%= it.pct.minSamples %> samples (insufficient)</summary><%~ include("@dashboard-percentiles", { rows: it.pct.thin, testid: false }) %></details><% } %>
<% } %>
<h2>Targets</h2>
<% if (it.counts.length === 0) { %><p data-testid="targets-empty">No targets yet.</p><% } else { %>
<table data-testid="targets-table"><thead><tr><th>Source</th><th>Status</th><th>Targets</th></tr></thead><tbody>
<% for (const r of it.counts) { %><tr><td><%= r.source %></td><td><%= r.status %></td><td class="num" data-testid="targets-<%= r.source %>-<%= r.status %>"><%= r.count %></td></tr><% } %>
</tbody></table><% } %>
<h2>Findings</h2><%~ it.findings %>`
)

const page = (title: string, body: string, refresh = true) => eta.render("@dashboard-layout", { title, css, body, refresh })

const targetHref = (a: WorkerApi.AssignmentView) => `/console/target?${new URLSearchParams({ source: a.target.source, identity: a.target.identity })}`

const activeRow = (a: WorkerApi.AssignmentView) => ({
  id: a.reservationId,
  source: a.target.source,
  identity: a.target.identity,
  href: targetHref(a),
  device: a.deviceId,
  slot: a.slot,
  phase: a.lastPhase ?? "none yet",
  deadlines: (
    [
      ["targetScan", "target-scan-deadline"],
      ["resultUpload", "result-upload-deadline"],
      ["assignmentExpiry", "assignment-expiry"]
    ] as const
  ).map(([key, name]) => ({
    testid: `active-${a.reservationId}-${name}`,
    next: a.nextDeadline?.which === key,
    iso: a.deadlines[key].iso,
    remaining: formatRemaining(a.deadlines[key].at - a.serverNow)
  })),
  next: a.nextDeadline ? a.nextDeadline.label : "all passed",
  remaining: a.nextDeadline ? formatRemaining(a.nextDeadline.remainingMs) : "passed",
  policy: `${a.policy.origin} TTL ${a.policy.ttlSeconds} s`
})

const expiredRow = (a: WorkerApi.AssignmentView) => ({
  id: a.reservationId,
  source: a.target.source,
  identity: a.target.identity,
  href: targetHref(a),
  device: a.deviceId,
  slot: a.slot,
  lastPhase: a.expiry?.lastPhase ?? "none (no progress accepted)",
  lastProgress: iso(a.expiry?.lastProgressAt ?? null),
  expiresAt: a.deadlines.assignmentExpiry.iso,
  expiredAt: iso(a.expiry?.expiredAt ?? null)
})

// A cycle that queued nothing, deferred nothing and failed nothing carries no information: such rows are collapsed.
const quietCycle = (c: z.infer<typeof WorkerApi.CycleView>) => c.queuedNewCount === 0 && c.queuedUpdatedCount === 0 && c.deferredCount === 0 && c.error === null

const cycleRow = (c: z.infer<typeof WorkerApi.CycleView>) => ({
  id: c.id,
  source: c.source,
  started: iso(c.startedAt),
  ended: iso(c.endedAt),
  pages: c.pages,
  results: c.results,
  malformed: c.malformed,
  queuedNew: c.queuedNewCount,
  queuedUpdated: c.queuedUpdatedCount,
  deferred: c.deferredCount >= Promotion.deferredCountLimit ? `≥ ${Promotion.deferredCountLimit.toLocaleString("en-US")}` : String(c.deferredCount),
  stop: c.stopReason,
  error: c.error ?? ""
})

const pctRow = (r: z.infer<typeof WorkerApi.PercentileResponse>["rows"][number]) => ({
  key: `${r.source}-${r.metric}-${r.outcome}`,
  source: r.source,
  metric: r.metric,
  outcome: r.outcome,
  count: r.count,
  cells: (["p50", "p95", "p99"] as const).map((name) => ({ name, insufficient: r[name].status === "insufficient", text: quantile(r[name]) }))
})

// Rows whose every percentile is insufficient say only their count: they are collapsed below the informative ones.
const informative = (r: z.infer<typeof WorkerApi.PercentileResponse>["rows"][number]) => r.p50.status === "ok" || r.p95.status === "ok" || r.p99.status === "ok"

const summaryItems = (s: z.infer<typeof WorkerApi.SummaryView>) => [
  { label: "Targets queued new", testid: "queued-new", n: s.targets.queuedNew },
  { label: "Targets queued updated", testid: "queued-updated", n: s.targets.queuedUpdated },
  { label: "Pending", testid: "pending", n: s.targets.pending },
  { label: "Assignments running", testid: "running", n: s.assignments.running },
  { label: "Completed", testid: "completed", n: s.assignments.completed },
  { label: "Timed out", testid: "timed-out", n: s.assignments.timedOut },
  { label: "Failed", testid: "failed", n: s.assignments.failed },
  { label: "Expired", testid: "expired", n: s.assignments.expired },
  { label: "Released", testid: "released", n: s.assignments.released }
]

const errorPage = (message: string, status: number) => {
  const auth = status === 401 || status === 403
  // the sign-in form is not reloaded under the typing hand
  return HttpServerResponse.html(page("scanfleet dashboard", eta.render("@dashboard-error", { message, auth, testid: auth ? "auth-error" : "error" }), !auth)).pipe(
    HttpServerResponse.setStatus(status),
    secured
  )
}

/**
 * GET /: the dashboard. `/?token=<admin token>` sets the admin cookie and redirects to `/`, so
 * the token leaves the address bar (the browser's history keeps the address opened: the
 * sign-in form, `POST /login`, keeps it out).
 */
const dashboard = Effect.gen(function* () {
  const req = yield* HttpServerRequest.HttpServerRequest
  const url = Url.parse(req.url)
  const given = url.searchParams.get("token")
  if (given !== null) {
    const settings = yield* Settings
    if (!Tokens.equal(given, settings.adminToken)) return errorPage("The admin token is wrong.", 401)
    url.searchParams.delete("token")
    return signedIn(`/${url.search}`, settings.adminToken)
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
  const body = eta.render("@dashboard", {
    now: iso(now),
    labels: { scan: Deadline.labels.scanDeadline, upload: Deadline.labels.uploadDeadline, expiry: Deadline.labels.expiresAt },
    heads: { scan: cap(Deadline.labels.scanDeadline), upload: cap(Deadline.labels.uploadDeadline), expiry: cap(Deadline.labels.expiresAt) },
    summary: summaryItems(summary),
    active: activeViews.map(activeRow),
    expired: expired.map((a) => expiredRow(Views.assignment(a, now, fleet.id))),
    cycles: { told: cycles.filter((c) => !quietCycle(c)).map(cycleRow), quiet: cycles.filter(quietCycle).map(cycleRow) },
    sources: Source.sources,
    q,
    pct: { windowHours: pct.windowHours, minSamples: pct.minSamples, known: pct.rows.filter(informative).map(pctRow), thin: pct.rows.filter((r) => !informative(r)).map(pctRow) },
    counts,
    findings
  })
  return secured(HttpServerResponse.html(page("scanfleet dashboard", body)))
}).pipe(
  Effect.catchTag("ApiError", (e: ApiError) =>
    Effect.succeed(errorPage(e.message, e.status))
  )
)

/** The admin session cookie for `settings`' admin token. */
const signedIn = (location: string, adminToken: string) =>
  HttpServerResponse.empty({ status: 303 }).pipe(
    HttpServerResponse.setHeader("location", location),
    HttpServerResponse.unsafeSetCookie(Auth.adminCookie, Auth.dashboardSession(adminToken), { httpOnly: true, sameSite: "strict", path: "/" })
  )

/**
 * POST /login: the sign-in form (`token`, the admin token). A match sets the admin cookie and
 * redirects to `/`; the token travels in the body, so it is in no address and no history. A
 * form over `Console.maxFormBytes` is 413; a wrong or missing token, 401 with the form again.
 */
const login = Effect.gen(function* () {
  const settings = yield* Settings
  const fields = new URLSearchParams(yield* Request.readBody(maxFormBytes))
  const given = fields.getAll("token")
  if (given.length !== 1 || !Tokens.equal(given[0], settings.adminToken)) return errorPage("The admin token is wrong.", 401)
  return signedIn("/", settings.adminToken)
}).pipe(Effect.catchTag("ApiError", (e: ApiError) => Effect.succeed(errorPage(e.message, e.status))))

/** The dashboard routes. */
export const router: HttpRouter.HttpRouter<ApiError, Store.Store | Settings> = HttpRouter.empty.pipe(HttpRouter.get("/", dashboard), HttpRouter.post("/login", login))
