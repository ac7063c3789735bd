import { Effect } from "effect"
import type * as Assignment from "./Assignment.js"
import * as Claim from "./Claim.js"
import { NotFound } from "./Errors.js"
import * as MemoryStore from "./MemoryStore.js"
import * as Operations from "./Operations.js"
import * as Priority from "./Priority.js"
import * as Retry from "./Retry.js"
import { sources, type Source } from "./Source.js"
import type { StoreShape } from "./Store.js"
import type * as Target from "./Target.js"

/**
 * The in-memory reference model of the operator port, over the maps of a memory Store
 * (`MemoryStore.make`). It applies core's rules directly; the SQL adapter is checked
 * against it by the operations conformance suite. Every method runs synchronously.
 *
 * @example
 * const store = MemoryStore.make()
 * const ops = MemoryOperations.make(store)
 */
export const make = (store: StoreShape): Operations.OperationsShape => {
  const st = MemoryStore.stateOf.get(store)
  if (!st) throw new Error("MemoryOperations.make needs a store made by MemoryStore.make")
  const redrive = new Map<number, Retry.RedriveState>()
  const cancellations = new Map<number, Operations.Cancellation>()
  const controls = new Map<Source, Operations.SourceControl>(Operations.unpaused().map((c) => [c.source, c]))
  const deviceSources = new Map<number, ReadonlyArray<Source> | null>()
  const audit: Array<Operations.AuditEntry> = []
  const leases = new Map<string, Operations.Lease>()

  const record = (action: Operations.Action, subject: string, detail: unknown, actor: Operations.Actor) => {
    const e: Operations.AuditEntry = { id: audit.length + 1, at: actor.now, who: actor.who, action, subject, why: actor.why, detail: JSON.stringify(detail ?? {}) }
    audit.push(e)
    return e
  }

  const of = (targetId: number) => [...st.assignments.values()].filter((a) => a.targetId === targetId)
  const lastEnded = (targetId: number) => of(targetId).reduce<number | null>((m, a) => (a.endedAt !== null && (m === null || a.endedAt > m) ? a.endedAt : m), null)

  const detail = (t: Target.Target): Operations.TargetDetail => ({
    ...t,
    redrive: redrive.get(t.id) ?? Retry.initialState,
    changedAt: Operations.changedAt(t, lastEnded(t.id))
  })

  const find = (source: Source, identity: string) => {
    const id = st.byKey.get(st.key(source, identity))
    return id === undefined ? Effect.fail(new NotFound({ entity: "target", key: `${source}:${identity}` })) : Effect.succeed(st.targets.get(id)!)
  }

  // Ends one active reservation as released and gives its target back, fenced like a release.
  const end = (a: Assignment.Assignment, now: number): Assignment.Assignment => {
    const t = st.targets.get(a.targetId)!
    if (Claim.holds(t, a.fence)) st.targets.set(t.id, Claim.release(t))
    const ended: Assignment.Assignment = { ...a, state: "released", endedAt: now }
    st.assignments.set(a.reservationId, ended)
    return ended
  }

  const deviceDetail = (id: number): Operations.DeviceDetail => {
    const { tokenHash: _, ...d } = st.devices.get(id)!
    const mine = [...st.assignments.values()].filter((a) => a.deviceId === id)
    const contact = mine.reduce<number | null>((m, a) => Math.max(m ?? 0, Operations.contactOf(a, cancellations.has(a.reservationId))), null)
    return {
      ...d,
      sources: deviceSources.get(id) ?? null,
      lastContactAt: contact,
      active: mine.filter((a) => a.state === "active").sort((x, y) => x.slot - y.slot)
    }
  }

  const ops: Operations.OperationsShape = {
    redriveDue: (source, policy, now, limit) =>
      Effect.sync(() => {
        let planned = 0
        const due: Array<{ t: Target.Target; s: Retry.RedriveState }> = []
        for (const t of [...st.targets.values()].sort((a, b) => a.id - b.id)) {
          if (t.source !== source || !Retry.isRedrivable(t.status)) continue
          let s = redrive.get(t.id) ?? Retry.initialState
          if (!Retry.isPlanned(t, s)) {
            s = Retry.plan(t, s, policy, lastEnded(t.id) ?? now)
            redrive.set(t.id, s)
            planned++
          }
          if (Retry.decide(t, s, now) !== null) due.push({ t, s })
        }
        const redriven = due
          .sort(Retry.order)
          .slice(0, Math.max(0, Math.floor(limit)))
          .map(({ t, s }) => {
            const reason = Retry.decide(t, s, now)!
            const next = Retry.redrive(t, s, reason)
            st.targets.set(t.id, next.target)
            redrive.set(t.id, next.state)
            return { identity: t.identity, reason }
          })
        return { redriven, planned }
      }),

    listTargets: (q) =>
      Effect.sync(() => {
        const limit = Math.max(0, Math.floor(q.limit))
        const page = [...st.targets.values()]
          .filter(
            (t) =>
              (q.after === undefined || t.id > q.after) &&
              (q.source === undefined || t.source === q.source) &&
              (q.status === undefined || t.status === q.status) &&
              (q.identityPrefix === undefined || t.identity.startsWith(q.identityPrefix))
          )
          .sort((a, b) => a.id - b.id)
          .map(detail)
          .filter((t) => q.changedSince === undefined || t.changedAt >= q.changedSince)
        const targets = page.slice(0, limit)
        return { targets, next: page.length > limit && targets.length > 0 ? targets[targets.length - 1].id : null }
      }),

    inspectTarget: (source, identity, limit, view) =>
      Effect.map(find(source, identity), (t) => ({
        target: detail(t),
        assignments: of(t.id)
          .sort((a, b) => b.reservationId - a.reservationId)
          .slice(0, Math.max(0, Math.floor(limit)))
          .map((assignment) => {
            const all = st.events.get(assignment.reservationId) ?? []
            const timeline = all
              .filter((e) => Operations.inspected(e, assignment.lastSeq, view))
              .map(({ detail, ...e }) => (view.details && detail !== undefined ? { ...e, detail } : e))
            return { assignment, timeline, omittedEvents: all.length - timeline.length, cancellation: cancellations.get(assignment.reservationId) ?? null }
          })
      })),

    requeue: (source, identity, actor) =>
      Effect.flatMap(find(source, identity), (t) => {
        const refused = Operations.requeueRefusal(t)
        if (refused) return Effect.fail(refused)
        const next = Operations.requeued(t)
        st.targets.set(t.id, next)
        redrive.delete(t.id)
        record("requeue", Operations.targetSubject(source, identity), { from: t.status }, actor)
        return Effect.succeed(detail(next))
      }),

    setPriority: (source, identity, priority, actor) =>
      Effect.suspend((): Effect.Effect<Operations.TargetDetail, NotFound | Operations.OperationRefused> => {
        const refused = Operations.priorityRefusal(priority)
        if (refused) return Effect.fail(refused)
        return Effect.map(find(source, identity), (t) => {
          const next = Priority.set(t, priority)
          st.targets.set(t.id, next)
          record("set_priority", Operations.targetSubject(source, identity), { from: t.priority, to: priority }, actor)
          return detail(next)
        })
      }),

    cancel: (reservationId, actor) =>
      Effect.suspend((): Effect.Effect<Assignment.Assignment, NotFound | Operations.OperationRefused> => {
        const a = st.assignments.get(reservationId)
        if (!a) return Effect.fail(new NotFound({ entity: "assignment", key: String(reservationId) }))
        if (a.state !== "active") return Effect.fail(new Operations.OperationRefused({ reason: "not_active", message: `reservation ${reservationId} is ${a.state}` }))
        const ended = end(a, actor.now)
        cancellations.set(reservationId, { reservationId, at: actor.now, who: actor.who, why: actor.why })
        record("cancel", `reservation:${reservationId}`, { target: Operations.targetSubject(a.source, a.identity), deviceId: a.deviceId }, actor)
        return Effect.succeed(ended)
      }),

    setPaused: (source, paused, actor) =>
      Effect.sync(() => {
        const c: Operations.SourceControl = paused
          ? { source, paused, pausedAt: actor.now, pausedBy: actor.who, reason: actor.why }
          : { source, paused, pausedAt: null, pausedBy: null, reason: null }
        controls.set(source, c)
        record(paused ? "pause_source" : "resume_source", `source:${source}`, {}, actor)
        return c
      }),

    sourceControls: () => Effect.sync(() => sources.map((s) => controls.get(s)!)),

    setDeviceSources: (deviceId, only, actor) =>
      Effect.suspend(() => {
        if (!st.devices.has(deviceId)) return Effect.fail(new NotFound({ entity: "device", key: String(deviceId) }))
        deviceSources.set(deviceId, only === null ? null : sources.filter((s) => only.includes(s)))
        record("set_device_sources", `device:${deviceId}`, { sources: only }, actor)
        return Effect.succeed(deviceDetail(deviceId))
      }),

    deviceFilters: () =>
      Effect.sync(() =>
        [...deviceSources.entries()]
          .filter((e): e is [number, ReadonlyArray<Source>] => e[1] !== null)
          .sort((a, b) => a[0] - b[0])
          .map(([deviceId, sources]) => ({ deviceId, sources }))
      ),

    listDevices: () => Effect.sync(() => [...st.devices.keys()].sort((a, b) => a - b).map(deviceDetail)),

    revokeDevice: (deviceId, actor) =>
      Effect.suspend(() => {
        const d = st.devices.get(deviceId)
        if (!d) return Effect.fail(new NotFound({ entity: "device", key: String(deviceId) }))
        st.devices.set(deviceId, { ...d, revokedAt: d.revokedAt ?? actor.now })
        const ended = [...st.assignments.values()]
          .filter((a) => a.deviceId === deviceId && a.state === "active")
          .sort((x, y) => x.reservationId - y.reservationId)
          .map((a) => end(a, actor.now))
        for (const a of ended) cancellations.set(a.reservationId, Operations.revocationOf(a.reservationId, deviceId, actor))
        record("revoke_device", `device:${deviceId}`, { released: ended.map((a) => a.reservationId) }, actor)
        return Effect.succeed(ended)
      }),

    outcomesOverTime: (from, to, bucketMs) =>
      Effect.sync(() => {
        const buckets = Operations.emptyBuckets(from, to, bucketMs)
        for (const a of st.assignments.values()) {
          const k = Operations.outcomeOf(a)
          if (k === null || a.endedAt! < from || a.endedAt! >= to) continue
          const b = buckets[Math.floor((a.endedAt! - from) / bucketMs)]
          if (b) buckets[buckets.indexOf(b)] = { ...b, [k]: b[k] + 1 }
        }
        return buckets
      }),

    audit: (action, subject, d, actor) => Effect.sync(() => record(action, subject, d, actor)),

    listAudit: (q) =>
      Effect.sync(() =>
        audit
          .filter((e) => q.before === undefined || e.id < q.before)
          .reverse()
          .slice(0, Math.max(0, Math.floor(q.limit)))
      ),

    cancellation: (reservationId) => Effect.sync(() => cancellations.get(reservationId) ?? null),

    acquireLease: (name, holder, ttlMs, now) =>
      Effect.sync(() => {
        const l = leases.get(name)
        if (l && l.holder !== holder && l.expiresAt > now) return null
        const next: Operations.Lease = { name, holder, token: l && l.holder === holder && l.expiresAt > now ? l.token : (l?.token ?? 0) + 1, expiresAt: now + ttlMs }
        leases.set(name, next)
        return next
      }),

    schemaVersion: () => Effect.succeed(null),

    // One synchronous step: nothing runs between the lease check and the promotion.
    promoteUnderLease: (lease, source, rule, now) =>
      Effect.sync(() => {
        const l = leases.get(lease.name)
        if (!l || l.holder !== lease.holder || l.token !== lease.token || l.expiresAt <= now) return null
        return Effect.runSync(store.promote(source, rule, now))
      }),

    releaseLease: (name, holder, token) =>
      Effect.sync(() => {
        const l = leases.get(name)
        if (l && l.holder === holder && l.token === token) leases.set(name, { ...l, expiresAt: 0 })
      })
  }
  return ops
}
