import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, FastCheck as fc } from "effect"
import { Assignment, Config, Discovery, MemoryStore, PhaseModel, Promotion, Source, Store, Target } from "@scanfleet/core"
import { T0 } from "./fixtures/arbitraries.js"

const run = <A, E>(e: Effect.Effect<A, E>): Either.Either<A, E> => Effect.runSync(Effect.either(e))

const identities = ["a", "b", "c", "d"] as const
const srcs = ["github", "dockerhub"] as const satisfies ReadonlyArray<Source.Source>

const command = fc.oneof(
  // A discovery cycle of one source: record a batch, then (usually) promote within a budget.
  {
    arbitrary: fc.record({
      op: fc.constant("cycle" as const),
      source: fc.constantFrom(...srcs),
      batch: fc.array(fc.record({ identity: fc.constantFrom(...identities), ago: fc.option(fc.nat({ max: 1_000 }), { nil: null }) }), { minLength: 1, maxLength: 5 }),
      promote: fc.boolean(),
      budget: fc.integer({ min: 0, max: 3 }),
      cooldownMs: fc.integer({ min: 0, max: 30 })
    }),
    weight: 6
  },
  { arbitrary: fc.record({ op: fc.constant("claim" as const), device: fc.integer({ min: 1, max: 2 }), slot: fc.integer({ min: 0, max: 2 }) }), weight: 3 },
  { arbitrary: fc.record({ op: fc.constant("progress" as const), pick: fc.nat(), choice: fc.nat(), replay: fc.boolean() }), weight: 3 },
  { arbitrary: fc.record({ op: fc.constant("submit" as const), pick: fc.nat(), outcome: fc.oneof(fc.constantFrom<Assignment.Outcome>("clean", "findings"), fc.constantFrom(...Assignment.outcomes)), staleFence: fc.nat({ max: 4 }).map((n) => n === 0) }), weight: 4 },
  { arbitrary: fc.record({ op: fc.constant("release" as const), pick: fc.nat() }), weight: 1 },
  { arbitrary: fc.record({ op: fc.constant("expire" as const) }), weight: 1 },
  // Mostly short steps, so results beat their deadlines; sometimes long ones, so assignments expire.
  { arbitrary: fc.record({ op: fc.constant("tick" as const), ms: fc.oneof({ arbitrary: fc.integer({ min: 1, max: 60_000 }), weight: 5 }, fc.integer({ min: 1, max: 4_000_000 })) }), weight: 1 }
)

/** Short deadlines so that ticks reach them. */
const config: Config.ManagedConfig = {
  ...Config.defaults,
  assignments: { globalTtlSeconds: 3000, handoffMarginSeconds: 60, overrides: { dockerhub: { ttlSeconds: 4000 } } }
}

describe("MemoryStore against the pure rules", () => {
  it.prop(
    "under any sequence of cycles, claims, progress, results, releases and expiries: observations only move forward, coverage moves only by claims, promotions stay within budget and once per covered revision, and every authority change moves the fence",
    [fc.array(command, { minLength: 1, maxLength: 80, size: "max" })],
    ([commands]) => {
      const store: Store.StoreShape = MemoryStore.make()
      const devices = [1, 2].map((i) => Either.getOrThrow(run(store.addDevice({ name: `d${i}`, slots: 2, tokenHash: `h${i}`, now: T0 }))))
      let now = T0
      const known = new Set<string>()
      const reservations: Array<number> = []
      // Worker writes mostly go to live reservations, sometimes to any reservation ever issued.
      const pickReservation = (pick: number): number | undefined => {
        const live = Either.getOrThrow(run(store.listAssignments({ state: "active", limit: 100 }))).map((a) => a.reservationId)
        const pool = pick % 4 === 0 || live.length === 0 ? reservations : live
        return pool.length === 0 ? undefined : pool[pick % pool.length]
      }
      const promotedBasis = new Map<number, number>()
      let promotions = 0
      const k = (s: Source.Source, i: string) => `${s}/${i}`
      const snapshot = () => {
        const m = new Map<string, Target.Target>()
        for (const key of known) {
          const [s, i] = key.split("/") as [Source.Source, string]
          m.set(key, Either.getOrThrow(run(store.getTarget(s, i))))
        }
        return m
      }

      for (const c of commands) {
        // Time passes between any two commands.
        now += 500
        const before = snapshot()
        switch (c.op) {
          case "cycle": {
            // Remote times trail the clock, so later observations tend to be newer, as on a real site.
            const batch = c.batch.map((o) => ({ source: c.source, identity: o.identity, remoteAt: o.ago === null ? null : now - o.ago }))
            const r = Either.getOrThrow(run(store.recordObservations(batch, now)))
            const inserted = r.inserted
            for (const o of batch) known.add(k(o.source, o.identity))
            const observed = snapshot()
            for (const [key, t] of before) {
              const seen = batch.filter((o) => k(o.source, o.identity) === key)
              const { observedRemoteAt, ...rest } = observed.get(key)!
              const { observedRemoteAt: old, ...restBefore } = t
              // Recording observations never changes a lifecycle or authority field.
              expect(rest).toEqual(restBefore)
              expect(observedRemoteAt).toBe(seen.reduce((m, o) => Target.mergeObserved(m, o.remoteAt), old))
            }
            expect(r.known + r.inserted.length).toBe(batch.length)
            if (!c.promote) break
            const rule = { budget: c.budget, cooldownMs: c.cooldownMs }
            const eligible = [...observed.values()].filter((t) => t.source === c.source && Promotion.isEligible(t, rule, now))
            const p = Either.getOrThrow(run(store.promote(c.source, rule, now)))
            promotions += p.promoted.length
            expect(p.promoted.length).toBeLessThanOrEqual(c.budget)
            expect(p.promoted.length + p.deferred).toBe(eligible.length)
            expect(Promotion.select(eligible, rule, now).promote.map((t) => t.identity)).toEqual(p.promoted)
            for (const id of p.promoted) {
              const t = observed.get(k(c.source, id))!
              // A covered revision is promoted at most once: the basis strictly grows between promotions.
              const basis = Promotion.coverageBasis(t)!
              const prior = promotedBasis.get(t.id)
              if (prior !== undefined) expect(basis).toBeGreaterThan(prior)
              promotedBasis.set(t.id, basis)
            }
            // What a cycle inserted is pending, so it cannot also be promoted: the counts never overlap.
            const counts = Discovery.counts(new Set(inserted), new Set(p.promoted))
            expect(counts).toEqual({ queuedNewCount: inserted.length, queuedUpdatedCount: p.promoted.length })
            break
          }
          case "claim": {
            const r = run(store.claim({ deviceId: devices[c.device - 1].id, slot: c.slot, now, config }))
            if (Either.isRight(r) && r.right !== null) {
              const a = r.right
              reservations.push(a.reservationId)
              const t0 = before.get(k(a.source, a.identity))!
              expect(t0.status).toBe("pending")
              expect(a.coveredRemoteAt).toBe(t0.observedRemoteAt)
              expect(a.fence).toBe(t0.fence + 1)
              expect(a.expiresAt - a.issuedAt).toBe(Config.effectivePolicy(config, a.source).ttlSeconds * 1000)
            } else {
              // A rejected claim, or nothing pending: no target changed at all.
              expect(snapshot()).toEqual(before)
            }
            break
          }
          case "progress": {
            const rid = pickReservation(c.pick)
            if (rid === undefined) break
            const a = Either.getOrThrow(run(store.getAssignment(rid)))
            const tl = Either.getOrThrow(run(store.timeline(rid)))
            const auth = { deviceId: a.deviceId, reservationId: rid, fence: a.fence, now }
            if (c.replay && tl.length > 0) {
              const old = tl[c.choice % tl.length]
              const { acceptedAt, ...e } = old
              const r = Either.getOrThrow(run(store.appendProgress(auth, [e])))
              expect(r.results).toEqual([{ seq: e.seq, status: "duplicate", acceptedAt }])
              expect(run(store.timeline(rid))).toEqual(Either.right(tl))
              break
            }
            const next = PhaseModel.phases.filter((p) => PhaseModel.canTransition(a.lastPhase, p))
            if (next.length === 0) break
            const e = { seq: a.lastSeq + 1, kind: "phase" as const, phase: next[c.choice % next.length], at: now }
            const r = run(store.appendProgress(auth, [e]))
            const after = Either.getOrThrow(run(store.getAssignment(rid)))
            // Progress never renews anything and never changes ownership.
            expect([after.expiresAt, after.scanDeadline, after.uploadDeadline, after.deviceId, after.fence]).toEqual([a.expiresAt, a.scanDeadline, a.uploadDeadline, a.deviceId, a.fence])
            if (Either.isRight(r)) expect(after.lastSeq).toBe(e.seq)
            else expect(after).toEqual(a)
            break
          }
          case "submit": {
            const rid = pickReservation(c.pick)
            if (rid === undefined) break
            const a = Either.getOrThrow(run(store.getAssignment(rid)))
            const r = run(store.submitResult({ deviceId: a.deviceId, reservationId: rid, fence: c.staleFence ? a.fence - 1 : a.fence, now, outcome: c.outcome, finalPhase: a.lastPhase, body: "{}" }))
            if (c.staleFence) expect(Either.isLeft(r) && r.left.reason).toBe("stale_fence")
            if (Either.isLeft(r)) expect(snapshot()).toEqual(before)
            break
          }
          case "release": {
            const rid = pickReservation(c.pick)
            if (rid === undefined) break
            const a = Either.getOrThrow(run(store.getAssignment(rid)))
            run(store.release({ deviceId: a.deviceId, reservationId: rid, fence: a.fence, now }))
            break
          }
          case "expire": {
            const due = Either.getOrThrow(run(store.expireDue({ now, maxAttempts: 2, limit: 10 })))
            for (const a of due) {
              expect(a.expiresAt).toBeLessThanOrEqual(now)
              expect(a.expiry).toEqual({ lastPhase: a.lastPhase, lastProgressAt: a.lastProgressAt, expiredAt: now })
            }
            break
          }
          case "tick":
            now += c.ms
            break
        }

        // Invariants that hold after every command.
        const after = snapshot()
        for (const [key, t] of after) {
          const b = before.get(key)
          if (b) {
            if (b.observedRemoteAt !== null) expect(t.observedRemoteAt).toBeGreaterThanOrEqual(b.observedRemoteAt)
            expect(t.fence).toBeGreaterThanOrEqual(b.fence)
            // covered_remote_at moves only by a successful claim, to the observation of that instant.
            if (t.coveredRemoteAt !== b.coveredRemoteAt) {
              expect(c.op).toBe("claim")
              expect(t.coveredRemoteAt).toBe(b.observedRemoteAt)
            }
            // Every authority change (promotion, claim, release, expiry to pending) bumps the fence once; nothing else moves it.
            if (t.status !== b.status && (t.status === "pending" || t.status === "in_progress")) expect(t.fence).toBe(b.fence + 1)
            if (t.status === b.status) expect(t.fence).toBe(b.fence)
          }
        }
        const active = Either.getOrThrow(run(store.listAssignments({ state: "active", limit: 1000 })))
        expect(new Set(active.map((a) => a.targetId)).size).toBe(active.length)
        for (const d of devices) expect(active.filter((a) => a.deviceId === d.id).length).toBeLessThanOrEqual(d.slots)
        for (const a of active) {
          const t = [...after.values()].find((x) => x.id === a.targetId)!
          expect(t.status).toBe("in_progress")
          expect(t.fence).toBe(a.fence)
        }
      }
    },
    { fastCheck: { numRuns: 100 } }
  )

  it.prop(
    "recordObservations never changes lifecycle or authority fields of non-completed targets",
    [
      fc.array(fc.constantFrom("pending", "in_progress", "completed", "failed", "unresolved", "expired"), { minLength: 1, maxLength: 8 }),
      fc.integer({ min: 1, max: 2 }),
      fc.array(fc.record({ i: fc.nat({ max: 7 }), remoteAt: fc.option(fc.integer({ min: T0 - 10_000, max: T0 + 10_000 }), { nil: null }) }), { minLength: 1, maxLength: 12 })
    ],
    ([fates, maxAttempts, observations]) => {
      const store = MemoryStore.make()
      const device = Either.getOrThrow(run(store.addDevice({ name: "d", slots: 8, tokenHash: "h", now: T0 })))
      Either.getOrThrow(run(store.recordObservations(fates.map((_, i) => ({ source: "gitlab", identity: `t${i}`, remoteAt: T0 - 20_000 })), T0)))
      // Drive each target to its fate through the store's own operations. Claims take the
      // lowest pending id, so all are claimed first; targets meant to expire are claimed earlier.
      const claimedAt = (fate: string) => (fate === "expired" ? T0 : T0 + 10_000_000)
      const issued = fates.map((fate, i) => {
        const a = Either.getOrThrow(run(store.claim({ deviceId: device.id, slot: i, now: claimedAt(fate), config: Config.defaults })))!
        expect(a.identity).toBe(`t${i}`)
        return a
      })
      fates.forEach((fate, i) => {
        const a = issued[i]
        const auth = { deviceId: device.id, reservationId: a.reservationId, fence: a.fence, now: a.issuedAt + 1 }
        const outcome = fate === "completed" ? "clean" : fate === "failed" ? "scan_error" : fate === "unresolved" ? "unsupported" : null
        if (outcome) Either.getOrThrow(run(store.submitResult({ ...auth, outcome, finalPhase: null, body: "{}" })))
        if (fate === "pending") Either.getOrThrow(run(store.release(auth)))
      })
      Either.getOrThrow(run(store.expireDue({ now: T0 + 5_000_000, maxAttempts, limit: 10 })))
      const get = (i: number) => Either.getOrThrow(run(store.getTarget("gitlab", `t${i}`)))
      const before = fates.map((_, i) => get(i))
      expect(before.map((t) => t.status)).toEqual(fates.map((f) => (f === "expired" ? (maxAttempts > 1 ? "pending" : "failed") : f)))
      const batch = observations.map((o) => ({ source: "gitlab" as const, identity: `t${o.i}`, remoteAt: o.remoteAt }))
      Either.getOrThrow(run(store.recordObservations(batch, T0 + 2)))
      before.forEach((b, i) => {
        const { observedRemoteAt, ...after } = get(i)
        const { observedRemoteAt: old, ...rest } = b
        expect(after).toEqual(rest)
        const newest = batch.filter((o) => o.identity === `t${i}`).reduce((m, o) => Target.mergeObserved(m, o.remoteAt), old)
        expect(observedRemoteAt).toBe(newest)
      })
    }
  )
})
