import type { Assignment, Config, Discovery, PhaseModel, Source, Store, Target } from "@scanfleet/core"

// Rows come back as plain records; both dialects use the same column names.
type Row = Record<string, unknown>

const num = (v: unknown): number => (typeof v === "number" ? v : Number(v))
const numOrNull = (v: unknown): number | null => (v === null || v === undefined ? null : num(v))
const strOrNull = <A extends string>(v: unknown): A | null => (v === null || v === undefined ? null : (String(v) as A))

/** Parses a JSON column: Postgres hands back jsonb parsed, SQLite hands back text. */
export const json = <A>(v: unknown): A => (typeof v === "string" ? (JSON.parse(v) as A) : (v as A))

/** The columns of a target row, in one place for every SELECT and RETURNING. */
export const targetColumns =
  "id, source, identity, status, observed_remote_at, covered_remote_at, completed_at, last_scan_started_at, fence, attempts, discovered_at, priority"

/** Decodes a target row. */
export const target = (r: Row): Target.Target => ({
  id: num(r.id),
  source: r.source as Source.Source,
  identity: String(r.identity),
  status: r.status as Target.Status,
  observedRemoteAt: numOrNull(r.observed_remote_at),
  coveredRemoteAt: numOrNull(r.covered_remote_at),
  completedAt: numOrNull(r.completed_at),
  lastScanStartedAt: numOrNull(r.last_scan_started_at),
  fence: num(r.fence),
  attempts: num(r.attempts),
  discoveredAt: num(r.discovered_at),
  priority: num(r.priority)
})

/**
 * The policy document of the assignment row named `row` (a table name or alias), read from
 * `policies` by its `policy_id` (since migration 0012 a policy is stored once, not copied into
 * every reservation). A scalar subquery rather than a join: it also serves a RETURNING
 * (SQLite's cannot name a joined table), and a locking read locks no policy row.
 */
export const policyOf = (row: string) => `(SELECT po.policy FROM policies po WHERE po.id = ${row}.policy_id) AS policy`

/** Every column `assignment` decodes, for a SELECT or RETURNING on the unaliased `assignments` table. */
export const assignmentColumns = `*, ${policyOf("assignments")}`

/** Decodes an assignment row: its columns and its `policy` (see `policyOf`). */
export const assignment = (r: Row): Assignment.Assignment => ({
  reservationId: num(r.reservation_id),
  targetId: num(r.target_id),
  source: r.source as Source.Source,
  identity: String(r.identity),
  deviceId: num(r.device_id),
  slot: num(r.slot),
  fence: num(r.fence),
  policy: json<Config.EffectivePolicy>(r.policy),
  coveredRemoteAt: numOrNull(r.covered_remote_at),
  issuedAt: num(r.issued_at),
  scanDeadline: num(r.scan_deadline),
  uploadDeadline: num(r.upload_deadline),
  expiresAt: num(r.expires_at),
  state: r.state as Assignment.State,
  lastPhase: strOrNull<PhaseModel.Phase>(r.last_phase),
  lastSeq: num(r.last_seq),
  lastProgressAt: numOrNull(r.last_progress_at),
  outcome: strOrNull<Assignment.Outcome>(r.outcome),
  finalPhase: strOrNull<PhaseModel.Phase>(r.final_phase),
  endedAt: numOrNull(r.ended_at),
  expiry:
    r.state === "expired"
      ? {
          lastPhase: strOrNull<PhaseModel.Phase>(r.expiry_last_phase),
          lastProgressAt: numOrNull(r.expiry_last_progress_at),
          expiredAt: num(r.expired_at)
        }
      : null
})

/** Decodes a stored progress event; `detail` is present only when it was sent. */
export const event = (r: Row): PhaseModel.Event & { readonly acceptedAt: number } => {
  const base = { seq: num(r.seq), kind: r.kind as PhaseModel.Event["kind"], phase: r.phase as PhaseModel.Phase, at: num(r.at) }
  return r.detail === null || r.detail === undefined
    ? { ...base, acceptedAt: num(r.accepted_at) }
    : { ...base, detail: String(r.detail), acceptedAt: num(r.accepted_at) }
}

/** Decodes a receipt row. */
export const receipt = (r: Row): Assignment.Receipt => ({
  receiptId: String(r.receipt_id),
  reservationId: num(r.reservation_id),
  outcome: r.outcome as Assignment.Outcome,
  acceptedAt: num(r.accepted_at)
})

/** Decodes a cycle row. */
export const cycle = (r: Row): Discovery.Cycle => ({
  id: num(r.id),
  source: r.source as Source.Source,
  startedAt: num(r.started_at),
  endedAt: num(r.ended_at),
  pages: num(r.pages),
  results: num(r.results),
  malformed: num(r.malformed),
  queuedNewCount: num(r.queued_new_count),
  queuedUpdatedCount: num(r.queued_updated_count),
  deferredCount: num(r.deferred_count),
  stopReason: r.stop_reason as Discovery.StopReason,
  error: strOrNull(r.error)
})

/** Decodes a device row (never its token hash). */
export const device = (r: Row): Store.Device => ({
  id: num(r.id),
  name: String(r.name),
  slots: num(r.slots),
  createdAt: num(r.created_at),
  revokedAt: numOrNull(r.revoked_at),
  containment: strOrNull(r.containment),
  reportedAt: numOrNull(r.reported_at)
})

/** Decodes a configuration version row. */
export const configVersion = (r: Row): Store.ConfigVersion => ({
  version: num(r.version),
  document: json<Config.ManagedConfig>(r.document),
  appliedBy: String(r.applied_by),
  appliedAt: num(r.applied_at)
})
