import { type Findings, FindingStore } from "@scanfleet/core"
import { Effect, Option } from "effect"
import { type ApiError, fromStoreError } from "./ApiError.js"
import { eta } from "./Console.js"

const iso = (ms: number | null) => (ms === null ? "—" : new Date(ms).toISOString())

/** How many findings the panel lists (the newest). */
export const shown = 25

/** Counts past this show as "more than" it: each status is counted up to here, whatever the number stored. */
export const countCap = 10_000

const shownCount = (n: number) => (n > countCap ? `> ${countCap.toLocaleString("en-US")}` : String(n))

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
  // Two bounded reads, whatever the number of findings stored: the page reloads every 5 s.
  const byStatus = yield* f.countByStatus(countCap).pipe(Effect.mapError(fromStoreError))
  const counts = { new: shownCount(byStatus.new), open: shownCount(byStatus.open), resolved: shownCount(byStatus.resolved) }
  const newest: ReadonlyArray<Findings.Finding> = yield* f.newest(shown).pipe(Effect.mapError(fromStoreError))
  const rows = newest.map((x) => ({
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
