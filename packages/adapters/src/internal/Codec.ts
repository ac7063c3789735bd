import type { Assignment, Config, Discovery, PhaseModel, Source, Store, Target } from "@scanfleet/core"

// Rows come back as plain records; both dialects use the same column names.
type Row = Record<string, unknown>

const num = (v: unknown): number => (typeof v === "number" ? v : Number(v))
const numOrNull = (v: unknown): number | null => (v === null || v === undefined ? null : num(v))
const strOrNull = <A extends string>(v: unknown): A | null => (v === null || v === undefined ? null : (String(v) as A))

/** Parses a JSON column: Postgres hands back jsonb parsed, SQLite hands back text. */
export const json = <A>(v: unknown): A => (typeof v === "string" ? (JSON.parse(v) as A) : (v as A))

// The position of each of `names` in a row read as values (`positions(["a", "b"]).b` is 1).
const positions = <const N extends ReadonlyArray<string>>(names: N) => Object.fromEntries(names.map((n, i) => [n, i])) as { readonly [K in N[number]]: number }

const targetNames = [
  "id", "source", "identity", "status", "observed_remote_at", "covered_remote_at", "completed_at", "last_scan_started_at", "fence", "attempts", "discovered_at", "priority"
] as const
const T = positions(targetNames)

/** The columns of a target row, in one place for every SELECT and RETURNING. */
export const targetColumns = targetNames.join(", ")

/** The same columns of the target row named `alias`, for a statement that reads it with others. */
export const targetFields = (alias: string) => targetNames.map((c) => `${alias}.${c}`).join(", ")

/** How many values `targetColumns` reads: where the next table's start in a row of values. */
export const targetWidth = targetNames.length

/** Decodes a target row. */
export const target = (r: Row): Target.Target => targetAt(targetNames.map((c) => r[c]), 0)

/** Decodes a target from a row of values (SQLite's raw rows) whose `targetColumns` start at `at`. */
export const targetAt = (v: ReadonlyArray<unknown>, at: number): Target.Target => ({
  id: num(v[at + T.id]),
  source: v[at + T.source] as Source.Source,
  identity: String(v[at + T.identity]),
  status: v[at + T.status] as Target.Status,
  observedRemoteAt: numOrNull(v[at + T.observed_remote_at]),
  coveredRemoteAt: numOrNull(v[at + T.covered_remote_at]),
  completedAt: numOrNull(v[at + T.completed_at]),
  lastScanStartedAt: numOrNull(v[at + T.last_scan_started_at]),
  fence: num(v[at + T.fence]),
  attempts: num(v[at + T.attempts]),
  discoveredAt: num(v[at + T.discovered_at]),
  priority: num(v[at + T.priority])
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

const assignmentNames = [
  "reservation_id", "target_id", "source", "identity", "device_id", "slot", "fence", "policy_id", "covered_remote_at", "issued_at", "scan_deadline",
  "upload_deadline", "expires_at", "state", "last_phase", "last_seq", "last_progress_at", "outcome", "final_phase", "ended_at",
  "expiry_last_phase", "expiry_last_progress_at", "expired_at"
] as const
const A = positions(assignmentNames)

/**
 * The columns `assignmentAt` decodes, every one named (no result body, no policy document),
 * of the assignment row named `alias`: for a statement that reads the policy by `policy_id` apart.
 */
export const assignmentFields = (alias: string) => assignmentNames.map((c) => `${alias}.${c}`).join(", ")

/** How many values `assignmentFields` reads. */
export const assignmentWidth = assignmentNames.length

/** The position of `policy_id` among `assignmentFields`. */
export const assignmentPolicyId = A.policy_id

/** Decodes an assignment row: its columns and its `policy` (see `policyOf`). */
export const assignment = (r: Row): Assignment.Assignment => assignmentAt(assignmentNames.map((c) => r[c]), 0, json<Config.EffectivePolicy>(r.policy))

/** Decodes an assignment from a row of values whose `assignmentFields` start at `at`, with its policy read apart. */
export const assignmentAt = (v: ReadonlyArray<unknown>, at: number, policy: Config.EffectivePolicy): Assignment.Assignment => {
  const state = v[at + A.state] as Assignment.State
  return {
    reservationId: num(v[at + A.reservation_id]),
    targetId: num(v[at + A.target_id]),
    source: v[at + A.source] as Source.Source,
    identity: String(v[at + A.identity]),
    deviceId: num(v[at + A.device_id]),
    slot: num(v[at + A.slot]),
    fence: num(v[at + A.fence]),
    policy,
    coveredRemoteAt: numOrNull(v[at + A.covered_remote_at]),
    issuedAt: num(v[at + A.issued_at]),
    scanDeadline: num(v[at + A.scan_deadline]),
    uploadDeadline: num(v[at + A.upload_deadline]),
    expiresAt: num(v[at + A.expires_at]),
    state,
    lastPhase: strOrNull<PhaseModel.Phase>(v[at + A.last_phase]),
    lastSeq: num(v[at + A.last_seq]),
    lastProgressAt: numOrNull(v[at + A.last_progress_at]),
    outcome: strOrNull<Assignment.Outcome>(v[at + A.outcome]),
    finalPhase: strOrNull<PhaseModel.Phase>(v[at + A.final_phase]),
    endedAt: numOrNull(v[at + A.ended_at]),
    expiry:
      state === "expired"
        ? {
            lastPhase: strOrNull<PhaseModel.Phase>(v[at + A.expiry_last_phase]),
            lastProgressAt: numOrNull(v[at + A.expiry_last_progress_at]),
            expiredAt: num(v[at + A.expired_at])
          }
        : null
  }
}

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
