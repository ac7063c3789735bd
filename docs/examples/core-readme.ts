import assert from "node:assert/strict"
import { Either } from "effect"
import { Claim, Config, Deadline, Promotion, RemoteTimestamp, Target } from "@scanfleet/core"

const now = Date.UTC(2025, 5, 1, 12, 0, 0)
const HOUR = 3_600_000

// A GitHub `pushed_at` becomes UTC epoch milliseconds; anything malformed is "no timestamp", never an exception.
const pushedAt = RemoteTimestamp.normalize("github", "2025-06-01T09:00:00+02:00", now)
assert.equal(RemoteTimestamp.normalize("github", "yesterday", now), undefined)

// Discovery admits the target; a claim snapshots what the scan covers; the scan completes.
let target = Target.admit(1, { source: "github", identity: "acme/api", remoteAt: pushedAt ?? null }, now - 2 * HOUR)
const claimed = Claim.claim(target, target.fence, now - 2 * HOUR)
if (Either.isLeft(claimed)) throw claimed.left
target = Claim.complete(claimed.right, now - 2 * HOUR + 60_000)

// The same revision is never scanned twice; a newer push is, once the cooldown has passed.
const rule = { cooldownMs: HOUR }
console.log(Promotion.decide(target, rule, now)) // { _tag: 'skip', reason: 'not_newer' }
target = Target.observe(target, { source: "github", identity: "acme/api", remoteAt: now - 10 * 60_000 })
console.log(Promotion.decide(target, rule, now)) // { _tag: 'promote' }

// An assignment for it would carry three deadlines, fixed at issuance and labelled by meaning.
const { policy, deadlines } = Deadline.issueFor(Config.defaults, "github", now)
console.log(policy.origin, Deadline.labels.scanDeadline, new Date(deadlines.scanDeadline).toISOString())
