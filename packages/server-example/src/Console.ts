import { HttpRouter, HttpServerRequest, HttpServerResponse } from "@effect/platform"
import { Records } from "@scanfleet/adapters"
import { AdminApi, Assignment, type Errors, Operations, Percentile, PhaseModel, Priority, Source, Store, Target, WorkerApi } from "@scanfleet/core"
import { Eta } from "eta"
import { Clock, Effect } from "effect"
import { readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { z } from "zod"
import * as AdminRoutes from "./AdminRoutes.js"
import { ApiError, fromNotFound, fromStoreError, invalid } from "./ApiError.js"
import * as Auth from "./Auth.js"
import * as Controls from "./Controls.js"
import * as Managed from "./internal/Managed.js"
import * as Request from "./internal/Request.js"
import * as Url from "./internal/Url.js"
import { targetView } from "./OperationsRoutes.js"
import { Settings } from "./ServerConfig.js"
import * as Tokens from "./Tokens.js"
import * as Views from "./Views.js"

/**
 * The operator console: server-rendered pages (no script needed) to search targets, inspect one
 * with its assignments (phase timeline bar, the three labelled deadlines, expiry evidence), and
 * act: requeue a target, set its claim priority, cancel an assignment, pause or resume a source. Pages are Eta templates
 * with auto-escaping on: every `<%= %>` value is escaped by the engine, and `<%~ %>` only ever
 * inserts the output of another template. Actions are POST forms behind the dashboard session
 * with a CSRF token bound to it, answered with a redirect back to the page.
 */

/** The console's template engine: escapes every interpolated value. */
export const eta = new Eta({ autoEscape: true, autoTrim: false, cache: true })

const css = `body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#222}h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:1.5rem}
nav a{margin-right:1rem}table{border-collapse:collapse;margin:.5rem 0}th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f3f3}.id{display:inline-block;max-width:28ch;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;vertical-align:bottom}
.muted{color:#777}.next{font-weight:bold}.bar{display:flex;width:100%;max-width:60rem;height:1.6rem;border:1px solid #999;margin:.25rem 0}
.bar span{overflow:hidden;white-space:nowrap;font-size:11px;line-height:1.6rem;padding:0 2px;color:#fff;border-right:1px solid #fff}
.p0{background:#4e79a7}.p1{background:#f28e2b}.p2{background:#59a14f}.p3{background:#b07aa1}.p4{background:#e15759}.p5{background:#76b7b2}.p6{background:#9c755f}
form.inline{display:inline}dl.kv{display:grid;grid-template-columns:max-content auto;gap:.1rem 1rem}dl.kv dt{color:#555}dl.kv dd{margin:0}
.refused{background:#fde8e8;border:1px solid #e0a0a0;padding:.5rem}.done{background:#e8f5e8;border:1px solid #a0d0a0;padding:.5rem}`

eta.loadTemplate(
  "@layout",
  `<!doctype html><html lang="en"><head><meta charset="utf-8"><title><%= it.title %></title><style><%~ it.css %></style></head>
<% if (it.scripts) { %><link rel="stylesheet" href="/assets/uplot.css"><% } %>
<body><nav><a href="/">Dashboard</a><a href="/console/targets">Targets</a><a href="/console/sources">Sources</a><a href="/console/devices">Devices</a><a href="/console/charts">Charts</a></nav>
<h1><%= it.title %></h1>
<% if (it.notice) { %><p class="<%= it.notice.kind %>" data-testid="notice"><%= it.notice.text %></p><% } %>
<%~ it.body %>
<% if (it.scripts) { %><script src="/assets/uplot.js"></script><script src="/assets/console-charts.js"></script><% } %>
</body></html>`
)

// An identity cut to fit its column, the full value on hover.
eta.loadTemplate("@identity", `<span class="id" title="<%= it.source %>:<%= it.id %>" data-testid="<%= it.testid %>"><%= it.source %>:<%= it.id %></span>`)

eta.loadTemplate(
  "@action",
  `<form class="inline" method="post" action="<%= it.action %>" data-testid="<%= it.testid %>">
<input type="hidden" name="csrf" value="<%= it.csrf %>"><input type="hidden" name="back" value="<%= it.back %>">
<% for (const [k, v] of it.fields) { %><input type="hidden" name="<%= k %>" value="<%= v %>"><% } %>
<input name="reason" required placeholder="reason (audited)" aria-label="reason" data-testid="<%= it.testid %>-reason">
<button data-testid="<%= it.testid %>-submit"><%= it.label %></button></form>`
)

// The priority form: the same hidden fields as an action, plus the number (the store checks its range).
eta.loadTemplate(
  "@priority",
  `<form class="inline" method="post" action="/console/actions/priority" data-testid="priority">
<input type="hidden" name="csrf" value="<%= it.csrf %>"><input type="hidden" name="back" value="<%= it.back %>">
<input type="hidden" name="source" value="<%= it.source %>"><input type="hidden" name="identity" value="<%= it.identity %>">
<label> Priority <input type="number" name="priority" min="<%= it.min %>" max="<%= it.max %>" step="1" value="<%= it.value %>" required data-testid="priority-value"></label>
<input name="reason" required placeholder="reason (audited)" aria-label="reason" data-testid="priority-reason">
<button data-testid="priority-submit">Set priority</button>
<span class="muted">from <%= it.min %> to <%= it.max %>; claims take a higher one first, by at most <%= it.shift %> targets per step</span></form>`
)

eta.loadTemplate(
  "@targets",
  `<form method="get" data-testid="target-search">
<label>Source <select name="source"><option value="">all</option><% for (const s of it.sources) { %><option<%= s === it.q.source ? " selected" : "" %>><%= s %></option><% } %></select></label>
<label> Status <select name="status"><option value="">all</option><% for (const s of it.statuses) { %><option<%= s === it.q.status ? " selected" : "" %>><%= s %></option><% } %></select></label>
<label> Identity starts with <input name="prefix" value="<%= it.q.prefix ?? "" %>" data-testid="target-search-prefix"></label>
<button data-testid="target-search-submit">Search</button></form>
<% if (it.rows.length === 0) { %><p data-testid="targets-none">No target matches.</p><% } else { %>
<table data-testid="targets-results"><thead><tr><th>Target</th><th>Status</th><th>Attempts at this revision</th><th>Observed remote</th><th>Covered remote</th><th>Changed</th></tr></thead><tbody>
<% for (const r of it.rows) { %><tr data-testid="target-row-<%= r.id %>"><td><a href="<%= r.href %>"><%~ include("@identity", { source: r.source, id: r.identity, testid: "target-" + r.id + "-identity" }) %></a></td>
<td data-testid="target-<%= r.id %>-status"><%= r.status %></td><td><%= r.attempts %></td><td><%= r.observed %></td><td><%= r.covered %></td><td><%= r.changed %></td></tr><% } %>
</tbody></table><% } %>
<% if (it.next) { %><p><a href="<%= it.next %>" data-testid="targets-next">Next page</a></p><% } %>`
)

eta.loadTemplate(
  "@target",
  `<h2><%~ include("@identity", { source: it.t.source, id: it.t.identity, testid: "target-identity" }) %></h2>
<dl class="kv" data-testid="target-fields">
<dt>Status</dt><dd data-testid="target-status"><%= it.t.status %></dd><dt>Fence</dt><dd data-testid="target-fence"><%= it.t.fence %></dd>
<dt>Attempts at this revision</dt><dd data-testid="target-attempts"><%= it.t.attempts %></dd>
<dt>Claim priority</dt><dd data-testid="target-priority"><%= it.t.priority %></dd>
<% for (const [k, v] of it.times) { %><dt><%= k %></dt><dd><%= v %></dd><% } %>
<dt>Failure backoff</dt><dd data-testid="target-backoff"><%= it.backoff %></dd></dl>
<% if (it.requeue) { %><%~ include("@action", it.requeue) %><% } %>
<%~ include("@priority", it.priority) %>
<h2>Assignments (<%= it.assignments.length %>)</h2>
<% for (const a of it.assignments) { %><section data-testid="assignment-<%= a.id %>">
<h3>Reservation <%= a.id %>: <span data-testid="assignment-<%= a.id %>-state"><%= a.state %></span><%= a.outcome ? " (" + a.outcome + ")" : "" %>, device <%= a.device %> slot <%= a.slot %></h3>
<table data-testid="assignment-<%= a.id %>-deadlines"><tbody><% for (const d of a.deadlines) { %>
<tr class="<%= d.next ? "next" : "" %>" data-testid="assignment-<%= a.id %>-<%= d.testid %>"><th><%= d.label %></th><td data-testid="assignment-<%= a.id %>-<%= d.testid %>-at"><%= d.iso %></td><td><%= d.note %></td></tr><% } %>
</tbody></table>
<% if (a.spans.length === 0) { %><p class="muted" data-testid="timeline-<%= a.id %>-empty">No progress accepted yet.</p><% } else { %>
<div class="bar" role="img" aria-label="phase timeline" data-testid="timeline-<%= a.id %>"><% a.spans.forEach((s, i) => { %><span class="p<%= s.color %>" style="width:<%= s.share %>%" title="<%= s.phase %>: <%= s.took %>" data-testid="timeline-<%= a.id %>-segment-<%= i %>" data-phase="<%= s.phase %>" data-ms="<%= s.ms %>"><%= s.phase %></span><% }) %></div>
<table data-testid="timeline-<%= a.id %>-table"><thead><tr><th>Phase</th><th>Started (device clock)</th><th>Time in phase</th></tr></thead><tbody>
<% for (const s of a.spans) { %><tr><td><%= s.phase %></td><td><%= s.start %></td><td><%= s.took %></td></tr><% } %></tbody></table><% } %>
<% if (a.recoveries > 0) { %><p class="muted" data-testid="timeline-<%= a.id %>-recoveries">The device recovered <%= a.recoveries %> time(s) during this assignment; GET /v1/admin/assignments/<%= a.id %> has every event.</p><% } %>
<% if (a.expiry) { %><p data-testid="assignment-<%= a.id %>-expiry"><%= a.expiry %></p><% } %>
<% if (a.cancellation) { %><p data-testid="assignment-<%= a.id %>-cancellation"><%= a.cancellation %></p><% } %>
<% if (a.cancel) { %><%~ include("@action", a.cancel) %><% } %>
</section><% } %>`
)

eta.loadTemplate(
  "@sources",
  `<table data-testid="sources-table"><thead><tr><th>Source</th><th>State</th><th>Paused by, at, why</th><th>Action</th></tr></thead><tbody>
<% for (const c of it.rows) { %><tr data-testid="source-<%= c.source %>"><td><%= c.source %></td><td data-testid="source-<%= c.source %>-state"><%= c.state %></td><td><%= c.who %></td><td><%~ include("@action", c.action) %></td></tr><% } %>
</tbody></table>`
)

eta.loadTemplate(
  "@devices",
  `<table data-testid="devices-table"><thead><tr><th>Device</th><th>Name</th><th>Slots</th><th>Containment (reported at)</th><th>Last contact</th><th>Active reservations</th><th>Claims</th><th>State</th></tr></thead><tbody>
<% for (const d of it.rows) { %><tr data-testid="device-<%= d.id %>"><td><%= d.id %></td><td><span class="id" title="<%= d.name %>"><%= d.name %></span></td><td><%= d.slots %></td><td><span data-testid="device-<%= d.id %>-containment"><%= d.containment %></span> (<%= d.reportedAt %>)</td><td><%= d.lastContact %></td><td data-testid="device-<%= d.id %>-active"><%= d.active %></td><td><%= d.sources %></td><td data-testid="device-<%= d.id %>-state"><%= d.state %></td></tr><% } %>
</tbody></table>`
)

eta.loadTemplate(
  "@charts",
  `<h2>Assignments ended and targets promoted, per hour (last 24 h)</h2>
<div class="chart" data-testid="chart-outcomes" data-chart="<%= it.outcomesChart %>"></div>
<details data-testid="chart-outcomes-table-box"><summary>The numbers</summary><table data-testid="chart-outcomes-table"><thead><tr><th>Hour (UTC)</th><th>Completed</th><th>Timed out</th><th>Failed</th><th>Expired</th><th>Promoted</th></tr></thead><tbody>
<% for (const r of it.outcomes) { %><tr><td><%= r.hour %></td><td><%= r.completed %></td><td><%= r.timedOut %></td><td><%= r.failed %></td><td><%= r.expired %></td><td><%= r.promoted %></td></tr><% } %></tbody></table></details>
<h2 data-testid="chart-percentiles-title">p50, p95 and p99 of <%= it.group.metric %> for <%= it.group.source %> / <%= it.group.outcome %>, <%= it.span.label %></h2>
<p class="muted"><%= it.chosen %> A window with fewer than <%= it.minSamples %> samples has no percentile (a gap in the chart, "insufficient" in the table).</p>
<form method="get" data-testid="chart-percentiles-form"><label>Source <select name="source" data-testid="chart-source"><% for (const v of it.choices.sources) { %><option<%= v === it.group.source ? " selected" : "" %>><%= v %></option><% } %></select></label>
<label> Metric <select name="metric" data-testid="chart-metric"><% for (const v of it.choices.metrics) { %><option<%= v === it.group.metric ? " selected" : "" %>><%= v %></option><% } %></select></label>
<label> Outcome <select name="outcome" data-testid="chart-outcome"><% for (const v of it.choices.outcomes) { %><option<%= v === it.group.outcome ? " selected" : "" %>><%= v %></option><% } %></select></label>
<label> Span <select name="span" data-testid="chart-span"><% for (const [k, v] of it.choices.spans) { %><option value="<%= k %>"<%= k === it.span.key ? " selected" : "" %>><%= v %></option><% } %></select></label>
<button data-testid="chart-percentiles-submit">Show</button></form>
<% if (it.groups.length > 0) { %><p class="muted">Groups with samples in this span: <% it.groups.forEach((g, i) => { %><%= i > 0 ? ", " : "" %><a href="<%= g.href %>"><%= g.label %></a> (<%= g.count %>)<% }) %></p><% } %>
<div class="chart" data-testid="chart-percentiles" data-chart="<%= it.percentilesChart %>"></div>
<details data-testid="chart-percentiles-table-box"><summary>The numbers</summary><table data-testid="chart-percentiles-table"><thead><tr><th>Window (UTC)</th><th>Samples</th><th>p50</th><th>p95</th><th>p99</th></tr></thead><tbody>
<% for (const r of it.windows) { %><tr data-testid="chart-window-<%= r.label %>"><td><%= r.label %></td><td><%= r.count %></td><td><%= r.p50 %></td><td><%= r.p95 %></td><td><%= r.p99 %></td></tr><% } %></tbody></table></details>
<noscript><p class="muted">The charts need script; the tables above hold the same numbers.</p></noscript>`
)

eta.loadTemplate("@message", `<p class="<%= it.kind %>" data-testid="<%= it.testid %>"><%= it.text %></p><% if (it.hint) { %><p><%= it.hint %></p><% } %>`)

const secured = (res: HttpServerResponse.HttpServerResponse) =>
  res.pipe(
    HttpServerResponse.setHeaders({
      "cache-control": "no-store",
      "x-content-type-options": "nosniff",
      "referrer-policy": "same-origin",
      "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"
    })
  )

const iso = (ms: number | null) => (ms === null ? "—" : new Date(ms).toISOString())

// The notice a page shows after an action redirected to it.
const noticeOf = (url: URL) => {
  const done = url.searchParams.get("done")
  const refused = url.searchParams.get("refused")
  // cut as the redirect cuts it: a link cannot make a page show more
  return done ? { kind: "done", text: notice(done) } : refused ? { kind: "refused", text: notice(refused) } : null
}

const page = (title: string, template: string, data: object, url: URL | null, status = 200, scripts = false) =>
  secured(
    HttpServerResponse.html(eta.render("@layout", { title, css, scripts, notice: url ? noticeOf(url) : null, body: eta.render(template, data) })).pipe(HttpServerResponse.setStatus(status))
  ).pipe(
    // Only the charts page runs script, and only the server's own files.
    scripts
      ? HttpServerResponse.setHeader("content-security-policy", "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
      : (r) => r
  )

const errorPage = (e: ApiError) =>
  page(
    "scanfleet console",
    "@message",
    {
      kind: "refused",
      testid: e.status === 401 || e.status === 403 ? "auth-error" : "error",
      text: e.message,
      hint: e.status === 401 ? "Open /?token=<admin token> once to start a dashboard session." : e.status === 400 || e.status === 413 ? "Nothing changed." : null
    },
    null,
    e.status
  ).pipe(e.close ? HttpServerResponse.setHeader("connection", "close") : (r) => r)

/** The CSRF token of a dashboard session: derived from the session, so a page of another origin cannot know it. */
export const csrfToken = (session: string) => Tokens.hash(`scanfleet-console-csrf:${session}`)

const csrfOf = Effect.map(Settings, (s) => csrfToken(Auth.dashboardSession(s.adminToken)))

const actionData = (action: string, csrf: string, back: string, fields: Record<string, string>, label: string, testid: string) => ({
  action,
  csrf,
  back,
  fields: Object.entries(fields),
  label,
  testid
})

const session = Auth.admin({ cookie: true })

const SearchQuery = AdminApi.TargetSearchQuery.extend({
  source: z.union([Source.SourceSchema, z.literal("")]).optional(),
  status: z.union([Target.StatusSchema, z.literal("")]).optional(),
  prefix: z.string().max(1024).optional(),
  done: z.string().optional(),
  refused: z.string().optional()
})

/** GET /console/targets: the target search. */
const targets = Effect.gen(function* () {
  yield* session
  const url = Url.parse((yield* HttpServerRequest.HttpServerRequest).url)
  const q = yield* Request.query(SearchQuery)
  const ops = yield* Operations.Operations
  const p = yield* ops
    .listTargets({ source: q.source || undefined, status: q.status || undefined, identityPrefix: q.prefix || undefined, changedSince: q.changedSince, after: q.after, limit: q.limit })
    .pipe(Effect.mapError(fromStoreError))
  // the next page is the same search: every filter and the page size as given
  const given = (k: string) => url.searchParams.get(k) ?? ""
  const keep = Object.fromEntries(["source", "status", "prefix", "changedSince", "limit"].filter((k) => given(k) !== "").map((k) => [k, given(k)]))
  return page(
    "Targets",
    "@targets",
    {
      q,
      sources: Source.sources,
      statuses: Target.statuses,
      rows: p.targets.map((t) => ({
        id: t.id,
        source: t.source,
        identity: t.identity,
        status: t.status,
        attempts: t.attempts,
        observed: iso(t.observedRemoteAt),
        covered: iso(t.coveredRemoteAt),
        changed: iso(t.changedAt),
        href: `/console/target?${new URLSearchParams({ source: t.source, identity: t.identity })}`
      })),
      next: p.next === null ? null : `/console/targets?${new URLSearchParams({ ...keep, after: String(p.next) })}`
    },
    url
  )
}).pipe(Effect.catchTag("ApiError", (e) => Effect.succeed(errorPage(e))))

/** The phase spans of an assignment for its timeline bar: each phase's share of the time, open phases up to the end (or now). */
export const timelineSpans = (a: WorkerApi.AssignmentView, events: ReadonlyArray<PhaseModel.Event>, now: number) => {
  const until = a.endedAt ?? now
  const spans = PhaseModel.spans(events).map((s) => ({ phase: s.phase, start: s.start, end: s.end ?? Math.max(s.start, until) }))
  const total = spans.reduce((n, s) => n + (s.end - s.start), 0)
  const took = (ms: number) => `${(ms / 1000).toFixed(ms < 10_000 ? 1 : 0)} s`
  return spans.map((s) => ({
    phase: s.phase,
    color: PhaseModel.phases.indexOf(s.phase) % 7,
    ms: s.end - s.start,
    share: (total > 0 ? ((s.end - s.start) / total) * 100 : 100 / spans.length).toFixed(3),
    took: took(s.end - s.start),
    start: iso(s.start)
  }))
}

const deadlineRows = (a: WorkerApi.AssignmentView) =>
  (
    [
      ["targetScan", "target-scan-deadline"],
      ["resultUpload", "result-upload-deadline"],
      ["assignmentExpiry", "assignment-expiry"]
    ] as const
  ).map(([key, testid]) => {
    const d = a.deadlines[key]
    const next = a.nextDeadline?.which === key
    return {
      testid,
      label: d.label[0].toUpperCase() + d.label.slice(1),
      iso: d.iso,
      next,
      note: next ? `fires next, in ${Math.max(0, Math.round(a.nextDeadline!.remainingMs / 1000))} s` : d.at <= a.serverNow ? "passed" : ""
    }
  })

/** GET /console/target?source=&identity=: one target, its assignments, their timelines and deadlines, and the actions. */
const target = Effect.gen(function* () {
  yield* session
  const url = Url.parse((yield* HttpServerRequest.HttpServerRequest).url)
  const q = yield* Request.query(AdminApi.TargetKeyQuery.extend({ done: z.string().optional(), refused: z.string().optional() }))
  const ops = yield* Operations.Operations
  const now = yield* Clock.currentTimeMillis
  const fleet = yield* Effect.flatMap(Store.Store, (s) => s.fleet()).pipe(Effect.mapError(fromStoreError))
  // The page draws phase spans only: recovered events and details are never read for it.
  const i = yield* ops.inspectTarget(q.source, q.identity, q.limit, { recent: 0, details: false }).pipe(Effect.mapError((e) => (e._tag === "NotFound" ? fromNotFound(e) : fromStoreError(e))))
  const csrf = yield* csrfOf
  const back = `/console/target?${new URLSearchParams({ source: q.source, identity: q.identity })}`
  const t = targetView(i.target)
  return page(
    `Target ${t.source}:${cut(t.identity, 60)}`,
    "@target",
    {
      t,
      times: [
        ["Observed remote time", iso(t.observedRemoteAt)],
        ["Covered remote time", iso(t.coveredRemoteAt)],
        ["Completed", iso(t.completedAt)],
        ["Last scan started", iso(t.lastScanStartedAt)],
        ["Discovered", iso(t.discoveredAt)],
        ["Changed", iso(t.changedAt)]
      ],
      backoff: `${t.redrive.redrives} redrive(s) at this revision; ${t.redrive.retryAt !== null ? `next redrive at ${iso(t.redrive.retryAt)}` : "no redrive planned"}`,
      priority: { csrf, back, source: t.source, identity: t.identity, value: t.priority, min: Priority.min, max: Priority.max, shift: Priority.step.toLocaleString("en") },
      requeue: t.status !== "in_progress" && t.status !== "pending" ? actionData("/console/actions/requeue", csrf, back, { source: t.source, identity: t.identity }, "Requeue", "requeue") : null,
      assignments: i.assignments.map(({ assignment, timeline, omittedEvents, cancellation }) => {
        const a = Views.assignment(assignment, now, fleet.id)
        return {
          id: a.reservationId,
          state: a.state,
          outcome: a.outcome,
          device: a.deviceId,
          slot: a.slot,
          deadlines: deadlineRows(a),
          spans: timelineSpans(a, timeline, now),
          recoveries: omittedEvents,
          expiry: a.expiry ? `Expired at ${iso(a.expiry.expiredAt)}; last accepted phase ${a.expiry.lastPhase ?? "none"}, last progress ${iso(a.expiry.lastProgressAt)}.` : null,
          cancellation: cancellation ? `Cancelled by ${cancellation.who} at ${iso(cancellation.at)}: ${cancellation.why}` : null,
          cancel: a.state === "active" ? actionData("/console/actions/cancel", csrf, back, { reservationId: String(a.reservationId) }, "Cancel this assignment", `cancel-${a.reservationId}`) : null
        }
      })
    },
    url
  )
}).pipe(Effect.catchTag("ApiError", (e) => Effect.succeed(errorPage(e))))

/** GET /console/sources: each source's controls, with pause and resume. */
const sources = Effect.gen(function* () {
  yield* session
  const url = Url.parse((yield* HttpServerRequest.HttpServerRequest).url)
  const ops = yield* Operations.Operations
  const cs = yield* ops.sourceControls().pipe(Effect.mapError(fromStoreError))
  const csrf = yield* csrfOf
  return page(
    "Sources",
    "@sources",
    {
      rows: cs.map((c) => ({
        source: c.source,
        state: c.paused ? "paused" : "running",
        who: c.paused ? `${c.pausedBy}, ${iso(c.pausedAt)}: ${c.reason}` : "",
        action: actionData(`/console/actions/${c.paused ? "resume" : "pause"}`, csrf, "/console/sources", { source: c.source }, c.paused ? "Resume" : "Pause", `${c.paused ? "resume" : "pause"}-${c.source}`)
      }))
    },
    url
  )
}).pipe(Effect.catchTag("ApiError", (e) => Effect.succeed(errorPage(e))))

/** GET /console/devices: every device with its slots, containment level (as its worker reported it), last contact and active reservations. */
const devices = Effect.gen(function* () {
  yield* session
  const url = Url.parse((yield* HttpServerRequest.HttpServerRequest).url)
  const ops = yield* Operations.Operations
  const ds = yield* ops.listDevices().pipe(Effect.mapError(fromStoreError))
  return page(
    "Devices",
    "@devices",
    {
      rows: ds.map((d) => ({
        id: d.id,
        name: d.name,
        slots: d.slots,
        containment: d.containment ?? "not reported yet",
        reportedAt: iso(d.reportedAt),
        lastContact: iso(d.lastContactAt),
        active: d.active.length === 0 ? "none" : d.active.map((a) => `${a.reservationId} (slot ${a.slot})`).join(", "),
        sources: d.sources === null ? "all sources" : d.sources.length === 0 ? "none (drained)" : d.sources.join(", "),
        state: d.revokedAt === null ? "live" : `revoked ${iso(d.revokedAt)}`
      }))
    },
    url
  )
}).pipe(Effect.catchTag("ApiError", (e) => Effect.succeed(errorPage(e))))

/**
 * The largest console form, in bytes: room for the longest identity, reason and page to return to,
 * each percent-encoded. A larger one is answered 413 as soon as the limit is crossed.
 */
export const maxFormBytes = 16 * 1024

// The longest page a console form returns to: a target's page whose identity is the longest the
// store keeps, every byte of it percent-encoded. Printable ASCII only, so it is a valid header.
const maxBackLength = `/console/target?source=${Source.sources.reduce((a, b) => (b.length > a.length ? b : a))}&identity=`.length + 3 * Records.maxIdentityBytes

const ActionForm = z
  .object({
    csrf: z.string(),
    back: z
      .string()
      .max(maxBackLength)
      .regex(/^\/console\/(targets|target|sources|devices)(\?[\x21-\x7e]*)?$/, "must be a console page that shows a notice (targets, target, sources, devices)"),
    reason: AdminApi.Reason,
    source: Source.SourceSchema.optional(),
    // as the JSON API checks an identity it adds (and discovery checks its records)
    identity: z
      .string()
      .min(1)
      .superRefine((s, ctx) => {
        const problem = Records.identityProblem(s)
        if (problem) ctx.addIssue({ code: "custom", message: problem })
      })
      .optional(),
    reservationId: WorkerApi.queryInteger(1, Number.MAX_SAFE_INTEGER).optional(),
    // an integer kept as text: the operator port refuses one out of range with its reason, shown on the page
    priority: z
      .string()
      .trim()
      .regex(/^[+-]?[0-9]{1,15}$/, "must be an integer")
      .optional()
  })
  .strict()

// The fields each action needs; an unknown action is refused on the page it came from.
const actionForms = {
  requeue: ActionForm.required({ source: true, identity: true }),
  priority: ActionForm.required({ source: true, identity: true, priority: true }),
  cancel: ActionForm.required({ reservationId: true }),
  pause: ActionForm.required({ source: true }),
  resume: ActionForm.required({ source: true })
}

// Text cut to `max` UTF-16 units with an ellipsis, never between the halves of a surrogate pair.
const cut = (text: string, max: number) => (text.length <= max ? text : `${text.slice(0, max - 1).replace(/[\ud800-\udbff]$/, "")}…`)

// A notice carried back in the redirect: cut, so a refusal quoting a long identity keeps `Location` small.
const maxNoticeLength = 200
const notice = (text: string) => cut(text, maxNoticeLength)

// Why a key or value of a form cannot cross the edge, by the JSON API's rules (a NUL, an unpaired surrogate, too long).
const refuseField = (k: string, v: string) => {
  const key = Request.refuseString(k, WorkerApi.maxKeyLength)
  if (key) return { name: JSON.stringify(k.slice(0, 64)), why: `the key ${key}` }
  const value = Request.refuseString(v, WorkerApi.maxStringLength)
  return value ? { name: k, why: value } : undefined
}

/**
 * The fields of a console form (a repeated key keeps every value it was given, which no field
 * accepts), and the 400 for its first key or value that cannot cross the edge, if one cannot.
 */
const formFields = (text: string) => {
  const fields: Record<string, string | Array<string>> = {}
  let refused: ApiError | undefined
  // URLSearchParams turns bytes that are not UTF-8 into U+FFFD; a form a browser sends never has them
  for (const part of text.split("&")) {
    try {
      decodeURIComponent(part.replace(/\+/g, " "))
    } catch {
      const name = part.split("=", 1)[0].slice(0, 64)
      refused = new ApiError({ status: 400, error: "invalid_body", message: `the request body is invalid: ${JSON.stringify(name)}: is not percent-encoded UTF-8`, issues: [{ path: [name], message: "is not percent-encoded UTF-8" }] })
      break
    }
  }
  for (const [k, v] of new URLSearchParams(text)) {
    const bad = refused ? undefined : refuseField(k, v)
    if (bad) refused = new ApiError({ status: 400, error: "invalid_body", message: `the request body is invalid: ${bad.name}: ${bad.why}`, issues: [{ path: [bad.name], message: bad.why }] })
    const prev = fields[k]
    fields[k] = prev === undefined ? v : Array.isArray(prev) ? [...prev, v] : [prev, v]
  }
  return { fields, refused }
}

/**
 * POST /console/actions/:action: one operator action from a console form; answers with a redirect to
 * the page it came from. A form over `maxFormBytes` is 413; without the session's CSRF token, 403;
 * with it, a field that breaks its limit is 400 naming the field. Nothing changes on any of these.
 */
const action = Effect.gen(function* () {
  yield* session
  const { fields, refused } = formFields(yield* Request.readBody(maxFormBytes))
  // The CSRF check comes first: a forged form learns nothing about its fields.
  const csrf = yield* csrfOf
  if (typeof fields.csrf !== "string" || !Tokens.equal(fields.csrf, csrf))
    return page("scanfleet console", "@message", { kind: "refused", testid: "error", text: "The form is invalid or expired (CSRF check failed); reload the page and try again. Nothing changed.", hint: null }, null, 403)
  if (refused) return yield* Effect.fail(refused)
  // The whole segment as sent (`pause/` or `pause;x` is 400); an unknown action is refused on its page below.
  const name = yield* Request.pathParam("action", "an action name", (v) => (Request.refuseString(v, 64) ? undefined : v))
  const form = (Object.hasOwn(actionForms, name) ? actionForms[name as keyof typeof actionForms] : ActionForm).safeParse(fields)
  if (!form.success) return yield* Effect.fail(invalid("body", form.error))
  const f = form.data
  const ops = yield* Operations.Operations
  const who: Operations.Actor = { who: "dashboard", why: f.reason, now: yield* Clock.currentTimeMillis }
  const run: Effect.Effect<string, Operations.OperationRefused | Errors.NotFound | Errors.StoreError | null, Controls.Controls> =
    name === "requeue" && f.source && f.identity
      ? Effect.as(ops.requeue(f.source, f.identity, who), `requeued ${f.source}:${f.identity}`)
      : name === "priority" && f.source && f.identity && f.priority !== undefined
        ? Effect.as(ops.setPriority(f.source, f.identity, Number(f.priority), who), `set the priority of ${f.source}:${f.identity} to ${Number(f.priority)}`)
      : name === "cancel" && f.reservationId
        ? Effect.as(ops.cancel(f.reservationId, who), `cancelled reservation ${f.reservationId}`)
        : (name === "pause" || name === "resume") && f.source
          ? Effect.as(
              Effect.zipLeft(ops.setPaused(f.source, name === "pause", who), Effect.flatMap(Controls.Controls, (c) => c.invalidate)),
              `${name === "pause" ? "paused" : "resumed"} ${f.source}`
            )
          : Effect.fail(null)
  const outcome = yield* run.pipe(
    Effect.map((done): Record<string, string> => ({ done })),
    Effect.catchAll((e) =>
      e !== null && e._tag === "StoreError"
        ? Effect.fail(fromStoreError(e))
        : Effect.succeed({ refused: e === null ? `unknown action ${name}` : e._tag === "NotFound" ? fromNotFound(e).message : e.message })
    )
  )
  const shown = Object.fromEntries(Object.entries(outcome).map(([k, v]) => [k, notice(v)]))
  return HttpServerResponse.empty({ status: 303 }).pipe(HttpServerResponse.setHeader("location", `${f.back}${f.back.includes("?") ? "&" : "?"}${new URLSearchParams(shown)}`))
}).pipe(Effect.catchTag("ApiError", (e) => Effect.succeed(errorPage(e))))

const HOUR = 3_600_000
// The spans the percentile chart offers: consecutive windows, each read on its own.
const spans = {
  "24h": { label: "per hour over the last 24 h", windowMs: HOUR, count: 24 },
  "7d": { label: "per 6 hours over the last 7 days", windowMs: 6 * HOUR, count: 28 }
} as const

const ChartsQuery = z
  .object({
    source: Source.SourceSchema.optional(),
    metric: Percentile.MetricSchema.optional(),
    outcome: Assignment.OutcomeSchema.optional(),
    span: z.enum(["24h", "7d"]).default("24h")
  })
  .strict()

/**
 * GET /console/charts: assignments ended and targets promoted per hour, and the p50/p95/p99 of one
 * group (source, metric, outcome; the busiest of the span unless chosen) in consecutive windows,
 * as charts over tables.
 */
const charts = Effect.gen(function* () {
  yield* session
  const url = Url.parse((yield* HttpServerRequest.HttpServerRequest).url)
  const q = yield* Request.query(ChartsQuery)
  const ops = yield* Operations.Operations
  const store = yield* Store.Store
  const now = yield* Clock.currentTimeMillis
  const from = Math.floor((now - 23 * HOUR) / HOUR) * HOUR
  const buckets = yield* ops.outcomesOverTime(from, from + 24 * HOUR, HOUR).pipe(Effect.mapError(fromStoreError))
  const cycles = yield* store.listCycles({ limit: 1000 }).pipe(Effect.mapError(fromStoreError))
  const promoted = buckets.map((b) => cycles.filter((c) => c.startedAt >= b.start && c.startedAt < b.start + HOUR).reduce((n, c) => n + c.queuedUpdatedCount, 0))
  const outcomes = buckets.map((b, i) => ({ ...b, hour: iso(b.start).slice(0, 13) + ":00", promoted: promoted[i] }))

  // The windows end with the one holding now; the group is the one asked for, filled in from the busiest matching group.
  const span = { key: q.span, ...spans[q.span] }
  const end = Math.floor(now / span.windowMs) * span.windowMs + span.windowMs
  const start = end - span.count * span.windowMs
  const { document } = yield* Managed.current
  const minSamples = document.metrics.minSamples
  const inSpan = [...(yield* store.percentiles({ from: start, to: end, minSamples }).pipe(Effect.mapError(fromStoreError)))].sort((a, b) => b.count - a.count)
  const busiest = inSpan.find((r) => (q.source === undefined || r.source === q.source) && (q.metric === undefined || r.metric === q.metric) && (q.outcome === undefined || r.outcome === q.outcome))
  const group = {
    source: q.source ?? busiest?.source ?? Source.sources[0],
    metric: q.metric ?? busiest?.metric ?? "end_to_end",
    outcome: q.outcome ?? busiest?.outcome ?? "clean"
  }
  const chosen =
    q.source !== undefined && q.metric !== undefined && q.outcome !== undefined
      ? "The group you chose."
      : busiest
        ? "The busiest group with samples in this span (choose another below)."
        : "No samples in this span yet."
  const windows = yield* Effect.forEach(Array.from({ length: span.count }, (_, i) => start + i * span.windowMs), (w) =>
    Effect.map(store.percentiles({ from: w, to: w + span.windowMs, ...group, minSamples }), (rows) => ({ start: w, ...(rows[0] ?? Percentile.summarize([], minSamples)) }))
  ).pipe(Effect.mapError(fromStoreError))
  const secs = (v: z.infer<typeof WorkerApi.QuantileView>) => (v.status === "ok" ? `${(v.value / 1000).toFixed(1)} s` : `insufficient (${v.count} of ${v.required} samples)`)
  const value = (v: z.infer<typeof WorkerApi.QuantileView>) => (v.status === "ok" ? v.value / 1000 : null)
  const groupHref = (g: { source: string; metric: string; outcome: string }) => `/console/charts?${new URLSearchParams({ source: g.source, metric: g.metric, outcome: g.outcome, span: span.key })}`
  return page(
    "Charts",
    "@charts",
    {
      outcomes,
      outcomesChart: JSON.stringify({
        kind: "time",
        x: buckets.map((b) => b.start / 1000),
        series: [
          { label: "completed", values: buckets.map((b) => b.completed) },
          { label: "timed out", values: buckets.map((b) => b.timedOut) },
          { label: "failed", values: buckets.map((b) => b.failed) },
          { label: "expired", values: buckets.map((b) => b.expired) },
          { label: "promoted", values: promoted }
        ]
      }),
      group,
      span,
      chosen,
      minSamples,
      choices: { sources: Source.sources, metrics: Percentile.metrics, outcomes: Assignment.outcomes, spans: Object.entries(spans).map(([k, v]) => [k, v.label]) },
      groups: inSpan.slice(0, 12).map((r) => ({ label: `${r.source} / ${r.metric} / ${r.outcome}`, count: r.count, href: groupHref(r) })),
      windows: windows.map((w) => ({ label: iso(w.start).slice(0, 16), count: w.count, p50: secs(w.p50), p95: secs(w.p95), p99: secs(w.p99) })),
      percentilesChart: JSON.stringify({
        kind: "time",
        xLabel: "window start",
        x: windows.map((w) => w.start / 1000),
        series: (["p50", "p95", "p99"] as const).map((k) => ({ label: `${k} (s)`, values: windows.map((w) => value(w[k])) }))
      })
    },
    url,
    200,
    true
  )
}).pipe(Effect.catchTag("ApiError", (e) => Effect.succeed(errorPage(e))))

// uPlot, served from this server (no CDN), and the few lines that draw each chart from its data attribute.
const require = createRequire(import.meta.url)
const asset = (specifier: string) => readFileSync(require.resolve(specifier), "utf8")
const assets = {
  "uplot.js": { type: "text/javascript; charset=utf-8", body: () => asset("uplot/dist/uPlot.iife.min.js") },
  "uplot.css": { type: "text/css; charset=utf-8", body: () => asset("uplot/dist/uPlot.min.css") },
  "console-charts.js": {
    type: "text/javascript; charset=utf-8",
    body: () => `"use strict";
document.querySelectorAll("[data-chart]").forEach(function (el) {
  var d = JSON.parse(el.getAttribute("data-chart"));
  var colors = ["#59a14f", "#e15759", "#f28e2b", "#9c755f", "#4e79a7"];
  var opts = {
    width: Math.min(900, el.clientWidth || 900), height: 260,
    scales: { x: { time: true } },
    series: [{ label: d.xLabel || "hour" }].concat(d.series.map(function (s, i) { return { label: s.label, stroke: colors[i % colors.length], width: 2, points: { show: true } }; }))
  };
  new uPlot(opts, [d.x].concat(d.series.map(function (s) { return s.values; })), el);
  el.setAttribute("data-drawn", "true");
});
`
  }
} as const

/** GET /assets/:name: the charting library and the console's chart script. */
const assetRoute = Effect.gen(function* () {
  const name = yield* Request.pathParam("name", "an asset name", (v) => (Request.refuseString(v, 64) ? undefined : v))
  const a = Object.hasOwn(assets, name) ? assets[name as keyof typeof assets] : undefined
  if (!a) return HttpServerResponse.text("not found", { status: 404 })
  return HttpServerResponse.text(a.body(), { contentType: a.type }).pipe(HttpServerResponse.setHeaders({ "cache-control": "public, max-age=3600", "x-content-type-options": "nosniff" }))
})

/** The console routes. */
export const router: HttpRouter.HttpRouter<ApiError, Operations.Operations | Controls.Controls | Settings | Store.Store> = HttpRouter.empty.pipe(
  HttpRouter.get("/console/targets", targets),
  HttpRouter.get("/console/target", target),
  HttpRouter.get("/console/sources", sources),
  HttpRouter.get("/console/devices", devices),
  HttpRouter.get("/console/charts", charts),
  HttpRouter.get("/assets/:name", assetRoute),
  HttpRouter.post("/console/actions/:action", action)
)
