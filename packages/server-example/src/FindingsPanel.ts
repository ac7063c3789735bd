import { type Findings, FindingStore } from "@scanfleet/core"
import { Effect, Option } from "effect"
import { type ApiError, fromStoreError } from "./ApiError.js"
import { eta } from "./Console.js"

const iso = (ms: number | null) => (ms === null ? "—" : new Date(ms).toISOString())

/** How many findings the panel lists (the newest). */
export const shown = 25

const countOf = (f: FindingStore.FindingStoreShape, status: Findings.Status) =>
  Effect.map(f.list({ status, limit: 10_000 }), (p) => (p.next === null ? String(p.findings.length) : `≥ ${p.findings.length}`))

// Previews and paths come from scanners: every value goes through the engine's escaping.
eta.loadTemplate(
  "@findings",
  `<% if (!it.available) { %><p data-testid="findings-unavailable">This server's store keeps no findings.</p><% } else { %>
<p>New <b data-testid="findings-new"><%= it.counts.new %></b> · still open <b data-testid="findings-open"><%= it.counts.open %></b> · resolved <b data-testid="findings-resolved"><%= it.counts.resolved %></b>. Secrets are shown only as redacted previews; see <code>/v1/admin/findings</code> and its exports.</p>
<% if (it.rows.length === 0) { %><p data-testid="findings-empty">No findings yet.</p><% } else { %>
<table data-testid="findings-table"><thead><tr><th>Finding</th><th>Target</th><th>Detector</th><th>Where</th><th>Preview</th><th>Verified</th><th>Status</th><th>First seen</th><th>Last seen</th><th>Resolved</th></tr></thead><tbody>
<% for (const x of it.rows) { %><tr data-testid="finding-row-<%= x.id %>"><td><%= x.id %></td><td><span class="id" title="<%= x.target %>" data-testid="finding-<%= x.id %>-target"><%= x.target %></span></td><td data-testid="finding-<%= x.id %>-detector"><%= x.detector %></td>
<td data-testid="finding-<%= x.id %>-where"><%= x.where %></td><td><code><%= x.preview %></code></td><td><%= x.verified %></td>
<td data-testid="finding-<%= x.id %>-status"><%= x.status %></td><td><%= x.firstSeen %><br><span class="muted"><%= x.firstRevision %></span></td><td><%= x.lastSeen %><br><span class="muted"><%= x.lastRevision %></span></td><td><%= x.resolved %></td></tr>
<% } %></tbody></table><% } %><% } %>`
)

/**
 * The dashboard's findings panel (an Eta template, auto-escaped): counts by status (new in the
 * latest scan of their target, still open, resolved) and the newest findings with their target,
 * detector, place, redacted preview and first and last sighting. Says so when the server's store
 * keeps no findings.
 */
export const render: Effect.Effect<string, ApiError> = Effect.gen(function* () {
  const found = yield* Effect.serviceOption(FindingStore.FindingStore)
  if (Option.isNone(found)) return eta.render("@findings", { available: false })
  const f = found.value
  const counts = yield* Effect.all({ new: countOf(f, "new"), open: countOf(f, "open"), resolved: countOf(f, "resolved") }).pipe(Effect.mapError(fromStoreError))
  // the newest: page from the end of the id order
  const all: Array<Findings.Finding> = []
  let after = 0
  for (;;) {
    const page = yield* f.list({ after, limit: 1000 }).pipe(Effect.mapError(fromStoreError))
    all.push(...page.findings)
    if (all.length > shown) all.splice(0, all.length - shown)
    if (page.next === null) break
    after = page.next
  }
  const rows = all.reverse().map((x) => ({
    id: x.id,
    target: `${x.source}:${x.identity}`,
    detector: x.detector,
    where: x.line === null ? x.path : `${x.path}:${x.line}`,
    preview: x.preview,
    verified: x.verified === null ? "—" : x.verified ? "yes" : "no",
    status: x.status,
    firstSeen: iso(x.firstSeenAt),
    firstRevision: x.firstRevision ?? "",
    lastSeen: iso(x.lastSeenAt),
    lastRevision: x.lastRevision ?? "",
    resolved: iso(x.resolvedAt)
  }))
  return eta.render("@findings", { available: true, counts, rows })
})
