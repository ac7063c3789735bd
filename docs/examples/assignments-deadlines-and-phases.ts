import assert from "node:assert/strict"
import { Either } from "effect"
import { Assignment, Config, Deadline, Percentile, PhaseModel } from "@scanfleet/core"

const t0 = Date.UTC(2025, 2, 1)

// 1. Preview a candidate configuration: DockerHub gets its own TTL, but one too short.
const candidate = {
  ...Config.defaults,
  assignments: { globalTtlSeconds: 3600, handoffMarginSeconds: 60, overrides: { dockerhub: { ttlSeconds: 3000 } } }
}
const preview = Config.preview(candidate)
assert.ok(Either.isLeft(preview))
for (const v of preview.left) console.log(`${v.path.join(".")}: ${v.message}`)
// assignments.overrides.dockerhub.ttlSeconds: dockerhub: the assignment expiry (...) must cover ... = 3360 s; raise ... to at least 3360 ...

// 2. Fixed, it validates; each source's policy says where its TTL comes from.
const config = Either.getOrThrow(Config.preview({ ...candidate, assignments: { ...candidate.assignments, overrides: { dockerhub: { ttlSeconds: 4000 } } } }))
const { policy, deadlines } = Deadline.issueFor(config, "dockerhub", t0)
assert.equal(policy.origin, "override")
assert.equal(Deadline.issueFor(config, "github", t0).policy.origin, "global")

// 3. The three deadlines, each by its meaning, and which fires next.
for (const which of ["scanDeadline", "uploadDeadline", "expiresAt"] as const)
  console.log(`${Deadline.labels[which]}: ${new Date(deadlines[which]).toISOString()}`)
const next = Deadline.next(deadlines, t0 + 60_000)
assert.equal(next?.label, "target-scan deadline")

// 4. A timeline with a restart: the sequence continues, the recovery is recorded, nothing is rewritten.
const events: Array<PhaseModel.Event> = [
  { seq: 1, kind: "phase", phase: "assigned", at: t0 },
  { seq: 2, kind: "phase", phase: "permit_wait", at: t0 + 1_000 },
  { seq: 3, kind: "phase", phase: "scanning", at: t0 + 2_000 },
  { seq: 4, kind: "recovered", phase: "scanning", at: t0 + 30_000, detail: "worker restarted" },
  { seq: 5, kind: "phase", phase: "cleanup", at: t0 + 62_000 },
  { seq: 6, kind: "phase", phase: "bundling", at: t0 + 64_000 },
  { seq: 7, kind: "phase", phase: "uploading", at: t0 + 65_000 },
  { seq: 8, kind: "phase", phase: "awaiting_receipt", at: t0 + 70_000 }
]
const timeline = Either.getOrThrow(PhaseModel.reduce(events))
assert.equal(timeline.phase, "awaiting_receipt")
const refused = PhaseModel.append(timeline, { seq: 8, kind: "phase", phase: "completed", at: t0 + 71_000 })
assert.ok(Either.isLeft(refused) && refused.left.reason === "sequence_gap")

// 5. Durations from the phases that completed, then percentiles with their sample counts.
const durations = Assignment.durationsOf({ source: "dockerhub", issuedAt: t0 }, timeline.events, "clean", t0 + 72_000, t0 + 65_000)
console.log(durations.map((d) => `${d.metric}=${d.ms}ms`).join(" ")) // end_to_end=72000ms scanning=60000ms cleanup=2000ms bundling=1000ms upload=7000ms
console.log(Percentile.summarize([60_000, 61_000, 58_000], config.metrics.minSamples).p95) // { status: 'insufficient', count: 3, required: 20 }
assert.equal(Percentile.cont([10, 20, 30, 40], 0.95), 38.5)
