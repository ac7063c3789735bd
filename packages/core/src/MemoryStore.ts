import { Clock, Context, Effect, Either, Layer, Random } from "effect"
import * as Assignment from "./Assignment.js"
import * as Claim from "./Claim.js"
import * as Deadline from "./Deadline.js"
// The operator port's model reads this store's maps; it is only called when a layer is built.
import * as MemoryOperations from "./MemoryOperations.js"
import * as Operations from "./Operations.js"
import { ClaimRejected, NotFound } from "./Errors.js"
import * as Percentile from "./Percentile.js"
import * as Priority from "./Priority.js"
import * as Promotion from "./Promotion.js"
import type { Source } from "./Source.js"
import { Store, compareAssignmentCounts, resultThenClaim, type AssignmentCount, type ClaimManyRequest, type ConfigVersion, type CycleTotal, type Device, type Fleet, type StoreShape } from "./Store.js"
import * as Target from "./Target.js"
import * as WorkerWrite from "./WorkerWrite.js"
import type { Cycle } from "./Discovery.js"

// A version-4 UUID from Effect's Random, so the store stays free of Node and of ambient randomness.
const randomUuid: Effect.Effect<string> = Effect.map(
  Effect.all(Array.from({ length: 16 }, () => Random.nextIntBetween(0, 256))),
  (b) => {
    b[6] = (b[6] & 0x0f) | 0x40
    b[8] = (b[8] & 0x3f) | 0x80
    const h = b.map((x) => x.toString(16).padStart(2, "0")).join("")
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`
  }
)

/** The maps a memory store keeps, shared with the operator port's model beside it (`MemoryOperations`). */
export interface State {
  readonly targets: Map<number, Target.Target>
  readonly byKey: Map<string, number>
  readonly assignments: Map<number, Assignment.Assignment>
  readonly events: Map<number, ReadonlyArray<WorkerWrite.StoredEvent>>
  readonly devices: Map<number, Device & { readonly tokenHash: string }>
  readonly key: (source: Source, identity: string) => string
}

/** The state of a store made by `make`. */
export const stateOf = new WeakMap<StoreShape, State>()

const key = (source: Source, identity: string) => `${source}\u0000${identity}`

/**
 * The in-memory reference implementation of the storage port. It applies
 * core's rules directly; the SQL adapters are checked against it by the
 * conformance suite. Every method runs synchronously, so each is atomic.
 *
 * @example
 * const store = MemoryStore.make()
 */
export const make = (): StoreShape => {
  const targets = new Map<number, Target.Target>()
  const byKey = new Map<string, number>()
  const assignments = new Map<number, Assignment.Assignment>()
  const events = new Map<number, Array<WorkerWrite.StoredEvent>>()
  const results = new Map<number, string>()
  const cycles: Array<Cycle> = []
  const durations: Array<Assignment.Duration> = []
  const configs: Array<ConfigVersion> = []
  const devices = new Map<number, Device & { tokenHash: string }>()
  let nextTarget = 1
  let nextReservation = 1
  let nextCycle = 1
  let nextDevice = 1
  // Chosen once per store (on first read), as a SQL store chooses it once per database.
  let fleet: Fleet | null = null

  // Ownership and fence of a worker write against the stored reservation, by core's rule.
  const authorize = (auth: { deviceId: number; reservationId: number; fence: number }) => WorkerWrite.authorize(auth, assignments.get(auth.reservationId))

  // A claim of one slot or of several, in one synchronous step: refused as a whole before anything
  // changes, or each slot in order takes the first pending target left in claim order (`Priority.compare`) (the batch's own claims
  // count against the per-source cap); it stops when nothing eligible is left.
  const claimSlots = (req: ClaimManyRequest): Either.Either<ReadonlyArray<Assignment.Assignment>, ClaimRejected> => {
    const d = devices.get(req.deviceId)
    if (!d || d.revokedAt !== null) return Either.left(new ClaimRejected({ reason: "unknown_device", message: `device ${req.deviceId} is not registered or was revoked` }))
    const active = [...assignments.values()].filter((a) => a.state === "active")
    const refused = Claim.refuseSlots(d.slots, active.filter((a) => a.deviceId === req.deviceId), req.slots)
    if (refused) return Either.left(refused)
    const inFlight = new Map<Source, number>()
    for (const a of active) inFlight.set(a.source, (inFlight.get(a.source) ?? 0) + 1)
    const issued: Array<Assignment.Assignment> = []
    for (const slot of req.slots) {
      let pick: Target.Target | undefined
      for (const t of targets.values()) {
        if (t.status !== "pending") continue
        if (req.sources && !req.sources.includes(t.source)) continue
        if (req.sourceCap !== undefined && (inFlight.get(t.source) ?? 0) >= req.sourceCap) continue
        if (!pick || Priority.compare(t, pick) < 0) pick = t
      }
      if (!pick) break
      // A pending target claimed at its own fence always succeeds.
      const t = Either.getOrThrow(Claim.claim(pick, pick.fence, req.now))
      targets.set(t.id, t)
      inFlight.set(t.source, (inFlight.get(t.source) ?? 0) + 1)
      const { policy, deadlines } = Deadline.issueFor(req.config, t.source, req.now)
      const a = Assignment.issued(t, { reservationId: nextReservation++, deviceId: req.deviceId, slot }, policy, deadlines)
      assignments.set(a.reservationId, a)
      events.set(a.reservationId, [])
      issued.push(a)
    }
    return Either.right(issued)
  }

  const store: StoreShape = {
    recordObservations: (batch, now) =>
      Effect.sync(() => {
        const inserted: Array<string> = []
        let known = 0
        for (const o of batch) {
          const id = byKey.get(key(o.source, o.identity))
          if (id === undefined) {
            const t = Target.admit(nextTarget++, o, now)
            targets.set(t.id, t)
            byKey.set(key(o.source, o.identity), t.id)
            inserted.push(o.identity)
          } else {
            known++
            targets.set(id, Target.observe(targets.get(id)!, o))
          }
        }
        return { inserted, known }
      }),

    promote: (source, rule, now) =>
      Effect.sync(() => {
        const candidates = [...targets.values()].filter((t) => t.source === source)
        const sel = Promotion.select(candidates, rule, now)
        for (const t of sel.promote) targets.set(t.id, Promotion.promote(t))
        return { promoted: sel.promote.map((t) => t.identity), deferred: Promotion.deferredCount(sel.deferred.length, rule.deferredLimit) }
      }),

    claim: (req) =>
      Effect.suspend(() => Either.match(claimSlots({ ...req, slots: [req.slot] }), { onLeft: Effect.fail, onRight: (as) => Effect.succeed(as[0] ?? null) })),

    claimMany: (req) => Effect.suspend(() => claimSlots(req)),

    appendProgress: (auth, batch) =>
      Effect.suspend(() => {
        const planned = Either.flatMap(authorize(auth), (a) => WorkerWrite.planProgress(a, events.get(a.reservationId)!, batch, auth.now))
        if (Either.isLeft(planned)) return Effect.fail(planned.left)
        const { results, fresh, assignment } = planned.right
        if (fresh.length > 0) {
          events.get(assignment.reservationId)!.push(...fresh)
          assignments.set(assignment.reservationId, assignment)
        }
        return Effect.succeed({ results, assignment })
      }),

    submitResult: (input) =>
      Effect.suspend(() => {
        const judged = WorkerWrite.judgeResult(input, assignments.get(input.reservationId), (a) => targets.get(a.targetId)!)
        if (Either.isLeft(judged)) return Effect.fail(judged.left)
        if (judged.right._tag === "repeat") return Effect.succeed(judged.right.receipt)
        const { receipt, targetStatus, state } = judged.right
        const a = assignments.get(input.reservationId)!
        const t = targets.get(a.targetId)!
        targets.set(t.id, targetStatus === "completed" ? Claim.complete(t, input.now) : Claim.fail(t, targetStatus))
        results.set(a.reservationId, input.body)
        durations.push(...WorkerWrite.durationsOfEnded(a, events.get(a.reservationId)!, input.outcome, input.now))
        assignments.set(a.reservationId, { ...a, state, outcome: input.outcome, finalPhase: input.finalPhase, endedAt: input.now })
        return Effect.succeed(receipt)
      }),

    submitResultAndClaim: (input, next) => resultThenClaim(store)(input, next),

    submitResults: (inputs) =>
      Effect.forEach(inputs, (input) =>
        store.submitResult(input).pipe(
          Effect.map((r) => Either.right(r)),
          Effect.catchTag("ReservationRefused", (e) => Effect.succeed(Either.left(e)))
        )
      ),

    release: (auth) =>
      Effect.suspend(() => {
        const judged = WorkerWrite.judgeRelease(auth, assignments.get(auth.reservationId), (a) => targets.get(a.targetId)!)
        if (Either.isLeft(judged)) return Effect.fail(judged.left)
        const released = judged.right
        targets.set(released.targetId, Claim.release(targets.get(released.targetId)!))
        assignments.set(released.reservationId, released)
        return Effect.succeed(released)
      }),

    expireDue: (req) =>
      Effect.sync(() => {
        const due = [...assignments.values()]
          .filter((a) => a.state === "active" && a.expiresAt <= req.now)
          .sort((x, y) => x.expiresAt - y.expiresAt || x.reservationId - y.reservationId)
          .slice(0, req.limit)
        const out: Array<Assignment.Assignment> = []
        for (const a of due) {
          const t = targets.get(a.targetId)!
          if (Claim.holds(t, a.fence)) targets.set(t.id, Claim.expire(t, req.maxAttempts))
          const expired: Assignment.Assignment = {
            ...a,
            state: "expired",
            endedAt: req.now,
            expiry: { lastPhase: a.lastPhase, lastProgressAt: a.lastProgressAt, expiredAt: req.now }
          }
          assignments.set(a.reservationId, expired)
          out.push(expired)
        }
        return out
      }),

    getAssignment: (reservationId) =>
      Effect.suspend(() => {
        const a = assignments.get(reservationId)
        return a ? Effect.succeed(a) : Effect.fail(new NotFound({ entity: "assignment", key: String(reservationId) }))
      }),

    listAssignments: (q) =>
      Effect.sync(() =>
        [...assignments.values()]
          .filter((a) => (q.state === undefined || a.state === q.state) && (q.deviceId === undefined || a.deviceId === q.deviceId))
          .sort((x, y) => y.reservationId - x.reservationId)
          .slice(0, q.limit)
      ),

    timeline: (reservationId) => Effect.sync(() => [...(events.get(reservationId) ?? [])]),

    getTarget: (source, identity) =>
      Effect.suspend(() => {
        const id = byKey.get(key(source, identity))
        return id === undefined ? Effect.fail(new NotFound({ entity: "target", key: `${source}:${identity}` })) : Effect.succeed(targets.get(id)!)
      }),

    countTargets: () =>
      Effect.sync(() => {
        const m = new Map<string, { source: Source; status: Target.Status; count: number }>()
        for (const t of targets.values()) {
          const k = `${t.source}/${t.status}`
          const c = m.get(k) ?? { source: t.source, status: t.status, count: 0 }
          c.count++
          m.set(k, c)
        }
        return [...m.values()].sort((a, b) => a.source.localeCompare(b.source) || a.status.localeCompare(b.status))
      }),

    countAssignments: () =>
      Effect.sync(() => {
        const m = new Map<string, AssignmentCount>()
        for (const a of assignments.values()) {
          const k = `${a.state}/${a.source}/${a.outcome ?? ""}/${a.lastPhase ?? ""}`
          const c = m.get(k)
          m.set(k, { state: a.state, source: a.source, outcome: a.outcome, lastPhase: a.lastPhase, count: (c?.count ?? 0) + 1 })
        }
        return [...m.values()].sort(compareAssignmentCounts)
      }),

    cycleTotals: () =>
      Effect.sync(() => {
        const m = new Map<Source, CycleTotal>()
        for (const c of cycles) {
          const t = m.get(c.source) ?? { source: c.source, cycles: 0, queuedNewCount: 0, queuedUpdatedCount: 0 }
          m.set(c.source, { source: c.source, cycles: t.cycles + 1, queuedNewCount: t.queuedNewCount + c.queuedNewCount, queuedUpdatedCount: t.queuedUpdatedCount + c.queuedUpdatedCount })
        }
        return [...m.values()].sort((a, b) => (a.source < b.source ? -1 : a.source > b.source ? 1 : 0))
      }),

    recordCycle: (c) =>
      Effect.sync(() => {
        const cycle = { ...c, id: nextCycle++ }
        cycles.push(cycle)
        return cycle
      }),

    listCycles: (q) =>
      Effect.sync(() =>
        cycles
          .filter((c) => q.source === undefined || c.source === q.source)
          .sort((a, b) => b.id - a.id)
          .slice(0, q.limit)
      ),

    recordDurations: (ds) =>
      Effect.suspend(() => {
        const stored = Percentile.storedDurations(ds)
        return stored === undefined ? Effect.fail(Percentile.unstorable()) : Effect.sync(() => void durations.push(...stored))
      }),

    percentiles: (query) =>
      Effect.sync(() => {
        const q = { ...query, ...Percentile.windowOf(query.from, query.to) }
        const groups = new Map<string, { source: Source; metric: Percentile.Metric; outcome: Assignment.Outcome; values: Array<number> }>()
        for (const d of durations) {
          if (d.at < q.from || d.at >= q.to) continue
          if ((q.source && d.source !== q.source) || (q.metric && d.metric !== q.metric) || (q.outcome && d.outcome !== q.outcome)) continue
          const k = `${d.source}/${d.metric}/${d.outcome}`
          const g = groups.get(k) ?? { source: d.source, metric: d.metric, outcome: d.outcome, values: [] }
          g.values.push(d.ms)
          groups.set(k, g)
        }
        return [...groups.values()]
          .sort((a, b) => a.source.localeCompare(b.source) || a.metric.localeCompare(b.metric) || a.outcome.localeCompare(b.outcome))
          .map((g) => ({ source: g.source, metric: g.metric, outcome: g.outcome, ...Percentile.summarizeHistogram(Percentile.histogram(g.values), q.minSamples) }))
      }),

    activeConfig: () => Effect.sync(() => configs[configs.length - 1] ?? null),

    applyConfig: (document, appliedBy, now) =>
      Effect.sync(() => {
        const v = { version: configs.length + 1, document, appliedBy, appliedAt: now }
        configs.push(v)
        return v
      }),

    addDevice: (d) =>
      Effect.sync(() => {
        const device = { id: nextDevice++, name: d.name, slots: d.slots, createdAt: d.now, revokedAt: null, containment: null, reportedAt: null, tokenHash: d.tokenHash }
        devices.set(device.id, device)
        const { tokenHash: _, ...pub } = device
        return pub
      }),

    deviceByTokenHash: (tokenHash) =>
      Effect.sync(() => {
        for (const d of devices.values())
          if (d.tokenHash === tokenHash && d.revokedAt === null) {
            const { tokenHash: _, ...pub } = d
            return pub
          }
        return null
      }),

    revokeDevice: (id, now) =>
      Effect.suspend(() => {
        const d = devices.get(id)
        if (!d) return Effect.fail(new NotFound({ entity: "device", key: String(id) }))
        devices.set(id, { ...d, revokedAt: d.revokedAt ?? now })
        return Effect.void
      }),

    reportDevice: (id, report) =>
      Effect.suspend(() => {
        const d = devices.get(id)
        if (!d || d.revokedAt !== null) return Effect.fail(new NotFound({ entity: "device", key: String(id) }))
        const next = { ...d, containment: report.containment, reportedAt: report.now }
        devices.set(id, next)
        const { tokenHash: _, ...pub } = next
        return Effect.succeed(pub)
      }),

    fleet: () =>
      fleet !== null
        ? Effect.succeed(fleet)
        : Effect.map(Effect.all([randomUuid, Clock.currentTimeMillis]), ([id, createdAt]) => (fleet ??= { id, createdAt }))
  }
  stateOf.set(store, { targets, byKey, assignments, events, devices, key })
  return store
}

/** A layer providing a fresh in-memory Store and the operator port's model over the same state (`MemoryOperations`). */
export const layer: Layer.Layer<Store | Operations.Operations> = Layer.effectContext(
  Effect.sync(() => {
    const store = make()
    return Context.make(Store, store).pipe(Context.add(Operations.Operations, MemoryOperations.make(store)))
  })
)
