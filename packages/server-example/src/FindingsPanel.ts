import { type Findings, FindingStore } from "@scanfleet/core"
import { Effect, Option } from "effect"
import { type ApiError, fromStoreError } from "./ApiError.js"

// The dashboard's escaping, for the values this panel prints (previews and paths come from scanners).
const esc = (s: unknown): string => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!)
const iso = (ms: number | null) => (ms === null ? "—" : new Date(ms).toISOString())

/** How many findings the panel lists (the newest). */
export const shown = 25

const countOf = (f: FindingStore.FindingStoreShape, status: Findings.Status) =>
  Effect.map(f.list({ status, limit: 10_000 }), (p) => (p.next === null ? String(p.findings.length) : `≥ ${p.findings.length}`))

/**
 * The dashboard's findings panel: counts by status (new in the latest scan of
 * their target, still open, resolved) and the newest findings with their
 * target, detector, place, redacted preview and first and last sighting. Empty
 * when the server's store keeps no findings.
 */
export const render: Effect.Effect<string, ApiError> = Effect.gen(function* () {
  const found = yield* Effect.serviceOption(FindingStore.FindingStore)
  if (Option.isNone(found)) return `<p data-testid="findings-unavailable">This server's store keeps no findings.</p>`
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
  const rows = all.reverse()
  const table =
    rows.length === 0
      ? `<p data-testid="findings-empty">No findings yet.</p>`
      : `<table data-testid="findings-table"><thead><tr><th>Finding</th><th>Target</th><th>Detector</th><th>Where</th><th>Preview</th><th>Verified</th><th>Status</th><th>First seen</th><th>Last seen</th><th>Resolved</th></tr></thead><tbody>
${rows
  .map(
    (x) => `<tr data-testid="finding-row-${x.id}"><td>${x.id}</td><td data-testid="finding-${x.id}-target">${esc(`${x.source}:${x.identity}`)}</td><td data-testid="finding-${x.id}-detector">${esc(x.detector)}</td>
<td data-testid="finding-${x.id}-where">${esc(x.line === null ? x.path : `${x.path}:${x.line}`)}</td><td><code>${esc(x.preview)}</code></td><td>${x.verified === null ? "—" : x.verified ? "yes" : "no"}</td>
<td data-testid="finding-${x.id}-status">${esc(x.status)}</td><td>${esc(iso(x.firstSeenAt))}<br><span class="muted">${esc(x.firstRevision ?? "")}</span></td><td>${esc(iso(x.lastSeenAt))}<br><span class="muted">${esc(x.lastRevision ?? "")}</span></td><td>${esc(iso(x.resolvedAt))}</td></tr>`
  )
  .join("\n")}
</tbody></table>`
  return `<p>New <b data-testid="findings-new">${counts.new}</b> · still open <b data-testid="findings-open">${counts.open}</b> · resolved <b data-testid="findings-resolved">${counts.resolved}</b>. Secrets are shown only as redacted previews; see <code>/v1/admin/findings</code> and its exports.</p>
${table}`
})
