/**
 * Internet-scale admission simulation, in simulated time, on core's pure rules.
 *
 * 10M targets over four sources, 10k devices, a per-source change rate and one
 * mass-change event. Every promotion decision is `Promotion.decide`, every
 * claim is `Claim.claim`; the candidate heap keeps core's documented order
 * (longest since last scan first, then id), so the first candidate still in
 * cooldown ends a cycle's scan of that source. Prints, per simulated day, the
 * queue depth and the worst wait per source, and exits non-zero if any changed
 * target waited past the bound the budget implies.
 *
 *   npx tsx soak/simulate.ts [--targets 10000000] [--devices 10000] [--days 21]
 */
import { Either } from "effect"
import { Claim, Promotion, type Source, type Target } from "@scanfleet/core"

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? Number(process.argv[i + 1]) : dflt
}
const TOTAL = arg("targets", 10_000_000)
const DEVICES = arg("devices", 10_000)
const DAYS = arg("days", 21)
const SLOTS_PER_DEVICE = 2
const HOUR = 3_600_000
const DAY = 24 * HOUR

interface SourceModel {
  readonly name: Source.Source
  readonly share: number
  /** Fraction of targets whose remote content changes per day. */
  readonly changePerDay: number
  /** New identities per day, as a fraction of the source. */
  readonly newPerDay: number
  readonly scanMinutes: number
  readonly budgetPerCycle: number
  readonly cooldownMs: number
}
const models: ReadonlyArray<SourceModel> = [
  { name: "github", share: 0.5, changePerDay: 0.004, newPerDay: 0.001, scanMinutes: 6, budgetPerCycle: 2500, cooldownMs: DAY },
  { name: "gitlab", share: 0.15, changePerDay: 0.003, newPerDay: 0.0005, scanMinutes: 6, budgetPerCycle: 600, cooldownMs: DAY },
  { name: "huggingface", share: 0.25, changePerDay: 0.008, newPerDay: 0.002, scanMinutes: 10, budgetPerCycle: 1500, cooldownMs: DAY },
  // DockerHub: a new digest is a new target; nothing is ever promoted.
  { name: "dockerhub", share: 0.1, changePerDay: 0, newPerDay: 0.003, scanMinutes: 12, budgetPerCycle: 0, cooldownMs: DAY }
]
// Day 5: a bulk re-upload touches 5% of HuggingFace at once.
const SURGE = { day: 5, source: "huggingface" as Source.Source, fraction: 0.05 }

// xorshift32: deterministic, so two runs print the same figures.
let seed = 0x9e3779b9
const rand = () => {
  seed ^= seed << 13; seed >>>= 0
  seed ^= seed >>> 17
  seed ^= seed << 5; seed >>>= 0
  return seed / 0x1_0000_0000
}

const CAP = Math.ceil(TOTAL * 1.2)
const srcOf = new Uint8Array(CAP)
const status = new Uint8Array(CAP) // 0 completed, 1 pending, 2 in_progress
const observed = new Float64Array(CAP)
const covered = new Float64Array(CAP)
const lastScan = new Float64Array(CAP)
const changedAt = new Float64Array(CAP).fill(-1) // first unscanned change, for waits
const inHeap = new Uint8Array(CAP)
let count = 0

const statusName = ["completed", "pending", "in_progress"] as const
const asTarget = (id: number): Target.Target => ({
  id,
  source: models[srcOf[id]].name,
  identity: String(id),
  status: statusName[status[id]],
  observedRemoteAt: observed[id] || null,
  coveredRemoteAt: covered[id] || null,
  completedAt: lastScan[id] || null,
  lastScanStartedAt: lastScan[id] || null,
  fence: 0,
  attempts: 1,
  discoveredAt: 0
})

/** A binary min-heap of target ids keyed by core's promotion order. */
class Heap {
  private a: Array<number> = []
  size = () => this.a.length
  private less = (x: number, y: number) => lastScan[x] < lastScan[y] || (lastScan[x] === lastScan[y] && x < y)
  push(id: number) {
    const a = this.a
    a.push(id)
    let i = a.length - 1
    while (i > 0) {
      const p = (i - 1) >> 1
      if (!this.less(a[i], a[p])) break
      ;[a[i], a[p]] = [a[p], a[i]]
      i = p
    }
  }
  peek = () => this.a[0]
  pop(): number {
    const a = this.a
    const top = a[0]
    const last = a.pop()!
    if (a.length > 0) {
      a[0] = last
      let i = 0
      for (;;) {
        const l = 2 * i + 1, r = l + 1
        let m = i
        if (l < a.length && this.less(a[l], a[m])) m = l
        if (r < a.length && this.less(a[r], a[m])) m = r
        if (m === i) break
        ;[a[i], a[m]] = [a[m], a[i]]
        i = m
      }
    }
    return top
  }
}

const start = Date.UTC(2026, 0, 1)
const candidates = models.map(() => new Heap())
const pending: Array<Array<number>> = models.map(() => [])
const pendingHead = models.map(() => 0)
const idsOf: Array<Array<number>> = models.map(() => [])

// Steady state: every target scanned once in the last 30 days, covering what it had then.
for (let s = 0; s < models.length; s++) {
  const n = Math.round(TOTAL * models[s].share)
  for (let k = 0; k < n; k++) {
    const id = ++count
    srcOf[id] = s
    idsOf[s].push(id)
    lastScan[id] = start - Math.floor(rand() * 30 * DAY)
    observed[id] = models[s].name === "dockerhub" ? 0 : lastScan[id] - Math.floor(rand() * 30 * DAY)
    covered[id] = observed[id]
  }
}

const stats = models.map(() => ({ promoted: 0, admittedNew: 0, scanned: 0, worstWaitMs: 0, maxPerCycle: 0 }))

const observe = (id: number, at: number) => {
  if (models[srcOf[id]].name === "dockerhub" || at <= observed[id]) return
  observed[id] = at
  if (changedAt[id] < 0) changedAt[id] = at
  if (status[id] === 0 && !inHeap[id]) {
    inHeap[id] = 1
    candidates[srcOf[id]].push(id)
  }
}

const slotsPerHour = DEVICES * SLOTS_PER_DEVICE * 60
const t0 = Date.now()
console.log(`simulating ${count.toLocaleString()} targets, ${DEVICES.toLocaleString()} devices × ${SLOTS_PER_DEVICE} slots, ${DAYS} days, hourly cycles`)
console.log("day  source       pending  waiting-changed  promoted/day  new/day  max/cycle  worst-wait-h")

for (let hour = 1; hour <= DAYS * 24; hour++) {
  const now = start + hour * HOUR
  const day = Math.ceil(hour / 24)
  const daily = models.map(() => ({ promoted: 0, admittedNew: 0 }))
  for (let s = 0; s < models.length; s++) {
    const m = models[s]
    const n = Math.round(TOTAL * m.share)
    // Remote changes this hour (spread inside the hour), plus the surge.
    let changes = Math.round((n * m.changePerDay) / 24)
    if (m.name === SURGE.source && hour === SURGE.day * 24) changes += Math.round(n * SURGE.fraction)
    const ids = idsOf[s]
    for (let k = 0; k < changes; k++) observe(ids[Math.floor(rand() * ids.length)], now - Math.floor(rand() * HOUR))
    // New identities: admitted as pending, never budgeted.
    const fresh = Math.round((n * m.newPerDay) / 24)
    for (let k = 0; k < fresh && count + 1 < CAP; k++) {
      const id = ++count
      srcOf[id] = s
      idsOf[s].push(id)
      status[id] = 1
      observed[id] = m.name === "dockerhub" ? 0 : now
      changedAt[id] = now
      pending[s].push(id)
      stats[s].admittedNew++
    }
    // The discovery cycle's budgeted promotion, in core's order.
    let promotedThisCycle = 0
    const heap = candidates[s]
    while (promotedThisCycle < m.budgetPerCycle && heap.size() > 0) {
      const id = heap.peek()
      const d = Promotion.decide(asTarget(id), { cooldownMs: m.cooldownMs }, now)
      if (d._tag === "skip" && d.reason === "cooldown") break // everyone behind it scanned later still
      heap.pop()
      inHeap[id] = 0
      if (d._tag === "promote") {
        status[id] = 1
        pending[s].push(id)
        promotedThisCycle++
      }
    }
    stats[s].promoted += promotedThisCycle
    stats[s].maxPerCycle = Math.max(stats[s].maxPerCycle, promotedThisCycle)
    if (promotedThisCycle > m.budgetPerCycle) throw new Error(`${m.name}: budget exceeded`)
  }
  // Devices claim and scan for the rest of the hour, sharing slot-minutes fairly.
  let slotMinutes = slotsPerHour
  let progressed = true
  while (slotMinutes > 0 && progressed) {
    progressed = false
    for (let s = 0; s < models.length && slotMinutes > 0; s++) {
      const q = pending[s]
      if (pendingHead[s] >= q.length) continue
      const id = q[pendingHead[s]++]
      const claimed = Claim.claim(asTarget(id), 0, now)
      if (Either.isLeft(claimed)) throw new Error(`claim refused: ${claimed.left.message}`)
      covered[id] = claimed.right.coveredRemoteAt ?? 0
      lastScan[id] = now
      status[id] = 0 // completes within the hour
      if (changedAt[id] >= 0) stats[s].worstWaitMs = Math.max(stats[s].worstWaitMs, now - changedAt[id])
      changedAt[id] = -1
      // An update seen during the scan stays newer than the snapshot: one follow-up.
      if (observed[id] > covered[id]) observe(id, observed[id])
      stats[s].scanned++
      slotMinutes -= models[s].scanMinutes
      progressed = true
    }
  }
  for (let s = 0; s < models.length; s++) if (pendingHead[s] > 100_000) { pending[s] = pending[s].slice(pendingHead[s]); pendingHead[s] = 0 }
  if (hour % 24 === 0) {
    for (let s = 0; s < models.length; s++) {
      const depth = pending[s].length - pendingHead[s]
      console.log(
        `${String(day).padStart(3)}  ${models[s].name.padEnd(11)} ${String(depth).padStart(8)}  ${String(candidates[s].size()).padStart(15)}  ${String(stats[s].promoted).padStart(12)}  ${String(stats[s].admittedNew).padStart(7)}  ${String(stats[s].maxPerCycle).padStart(9)}  ${(stats[s].worstWaitMs / HOUR).toFixed(1).padStart(12)}`
      )
      stats[s].promoted = 0
      stats[s].admittedNew = 0
    }
  }
}

// Bound: a surge of S changes drains at `budget` per cycle after the cooldown.
let failed = false
const end = start + DAYS * 24 * HOUR
for (let s = 0; s < models.length; s++) {
  const m = models[s]
  if (m.budgetPerCycle === 0) continue
  let oldest = 0
  for (let id = 1; id <= count; id++) if (srcOf[id] === s && changedAt[id] >= 0) oldest = Math.max(oldest, end - changedAt[id])
  const n = Math.round(TOTAL * m.share)
  // The backlog drains at the budget less the steady change rate; a source whose
  // steady changes exceed its budget has no bound, and that is a configuration error.
  const steadyPerHour = (n * m.changePerDay) / 24
  const drainPerHour = m.budgetPerCycle - steadyPerHour
  const surge = m.name === SURGE.source ? n * SURGE.fraction : 0
  const boundH = drainPerHour > 0 ? m.cooldownMs / HOUR + Math.ceil((surge + steadyPerHour * 24) / drainPerHour) + 24 : Infinity
  const ok = stats[s].worstWaitMs / HOUR <= boundH && oldest / HOUR <= boundH
  if (!ok) failed = true
  console.log(`${m.name}: worst wait ${(stats[s].worstWaitMs / HOUR).toFixed(1)} h, oldest unscanned change ${(oldest / HOUR).toFixed(1)} h, bound ${boundH} h: ${ok ? "ok" : "EXCEEDED"}`)
}
console.log(`simulated in ${((Date.now() - t0) / 1000).toFixed(1)} s`)
process.exit(failed ? 1 : 0)
