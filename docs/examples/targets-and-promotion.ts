import assert from "node:assert/strict"
import { Effect } from "effect"
import { Config, MemoryStore, Promotion, RemoteTimestamp, Store } from "@scanfleet/core"

const HOUR = 3_600_000
const DAY = 24 * HOUR
const t0 = Date.UTC(2025, 2, 1)

// 1. A source record becomes an observation: its timestamp normalised to UTC ms, or null.
const record = { full_name: "acme/widget", pushed_at: "2025-02-28T09:00:00+01:00" }
const remoteAt = RemoteTimestamp.fromRecord("github", record, t0) ?? null
assert.equal(remoteAt, Date.UTC(2025, 1, 28, 8))
assert.equal(RemoteTimestamp.fromRecord("github", { pushed_at: "2025-02-28T09:00:00" }, t0), undefined) // no offset: not valid

const program = Effect.gen(function* () {
  const store = yield* Store.Store
  const device = yield* store.addDevice({ name: "scanner-01", slots: 1, tokenHash: "example", now: t0 })

  // 2. Discovery admits the new target; a claim snapshots what it covers.
  yield* store.recordObservations([{ source: "github", identity: record.full_name, remoteAt }], t0)
  const first = yield* store.claim({ deviceId: device.id, slot: 0, now: t0, config: Config.defaults })
  assert.equal(first?.coveredRemoteAt, remoteAt)
  const authority = { deviceId: device.id, reservationId: first!.reservationId, fence: first!.fence }
  yield* store.submitResult({ ...authority, now: t0 + 10 * 60_000, outcome: "clean", finalPhase: "awaiting_receipt", body: "{}" })

  // 3. The repository changes. A relist that sees an older value never lowers the observation.
  const pushed = Date.UTC(2025, 2, 1, 12)
  yield* store.recordObservations([{ source: "github", identity: record.full_name, remoteAt: pushed }], t0 + 12 * HOUR)
  yield* store.recordObservations([{ source: "github", identity: record.full_name, remoteAt: remoteAt }], t0 + 13 * HOUR)
  const changed = yield* store.getTarget("github", record.full_name)
  assert.equal(changed.observedRemoteAt, pushed)

  // 4. Promotion waits for the source's cooldown since the last scan, then moves the target back to pending once.
  const rule = { cooldownMs: Config.defaults.sources.github.cooldownSeconds * 1000, budget: Config.defaults.sources.github.promotionBudget }
  console.log(Promotion.decide(changed, rule, t0 + 13 * HOUR)) // { _tag: 'skip', reason: 'cooldown' }
  assert.deepEqual((yield* store.promote("github", rule, t0 + 13 * HOUR)).promoted, [])
  assert.deepEqual((yield* store.promote("github", rule, t0 + DAY)).promoted, ["acme/widget"])
  assert.deepEqual((yield* store.promote("github", rule, t0 + DAY)).promoted, []) // at most once per covered revision

  const second = yield* store.claim({ deviceId: device.id, slot: 0, now: t0 + DAY, config: Config.defaults })
  assert.equal(second?.coveredRemoteAt, pushed)
  console.log(`rescanned ${second?.identity} covering ${new Date(pushed).toISOString()}`)
})

await Effect.runPromise(program.pipe(Effect.provide(MemoryStore.layer)))
