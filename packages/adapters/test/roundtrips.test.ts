import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { inject } from "vitest"
import { Config, type PhaseModel, Store, type Target } from "@scanfleet/core"
import * as PgStore from "../src/PgStore.js"
import { countStatements } from "./support/Counting.js"
import { capturing } from "./support/PgCapture.js"
import { schema, urlFor } from "./support/PgSchema.js"
import { freshStore as freshSqlite } from "./support/TempSqlite.js"

const T0 = Date.UTC(2025, 0, 1)
const batch = (n: number, at: number): ReadonlyArray<Target.Observation> => Array.from({ length: n }, (_, i) => ({ source: "github", identity: `bulk/${i}`, remoteAt: at - i }))

describe("recording a batch of 10,000 observations costs O(1) round trips", () => {
  it.live("postgres: one query on the wire per batch, counted at the connection", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const wire = capturing(urlFor(inject("pgUrl"), name))
      const store = yield* Effect.provide(PgStore.make, yield* Layer.build(wire.layer))
      const before = wire.sent.length
      const first = yield* store.recordObservations(batch(10_000, T0), T0)
      expect(first.inserted).toHaveLength(10_000)
      expect(wire.sent.length - before).toBe(1)
      const again = yield* store.recordObservations(batch(10_000, T0 + 1000), T0 + 1)
      expect(again).toEqual({ inserted: [], known: 10_000 })
      expect(wire.sent.length - before).toBe(2)
    }).pipe(Effect.scoped))

  it.live("sqlite: one transaction of prepared statements whatever the batch size; no statement is compiled per call", () =>
    Effect.gen(function* () {
      const store = yield* Store.Store
      const small = yield* countStatements(store.recordObservations(batch(10, T0), T0))
      const large = yield* countStatements(store.recordObservations(batch(10_000, T0 + 1), T0 + 1))
      expect(small.value.inserted).toHaveLength(10)
      expect(large.value.inserted).toHaveLength(9_990)
      expect(large.value.known).toBe(10)
      // In-process, a prepared statement costs no round trip: none goes through @effect/sql's compiler.
      expect([small.statements, large.statements]).toEqual([0, 0])
    }).pipe(Effect.provide(freshSqlite())))

  it.live("postgres through the tracer agrees: one statement per batch", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const store = yield* Effect.provide(PgStore.make, yield* Layer.build(PgStore.clientLayer({ url: Redacted.make(urlFor(inject("pgUrl"), name)) })))
      const r = yield* countStatements(store.recordObservations(batch(10_000, T0), T0))
      expect(r.statements).toBe(1)
    }).pipe(Effect.scoped))
})

const stagePhases = ["assigned", "permit_wait", "preparing", "acquiring", "scanning", "filtering", "cleanup", "staging"] as const
const progress = (from: number, n: number): ReadonlyArray<PhaseModel.Event> =>
  Array.from({ length: n }, (_, i) => {
    const seq = from + i
    return seq <= stagePhases.length
      ? { seq, kind: "phase", phase: stagePhases[seq - 1], at: T0 + seq }
      : { seq, kind: "recovered", phase: "staging", at: T0 + seq, detail: "still staging" }
  })

const reserved = (store: Store.StoreShape) =>
  Effect.gen(function* () {
    const d = yield* store.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
    yield* store.recordObservations([{ source: "github", identity: "progress", remoteAt: null }], T0)
    const a = yield* store.claim({ deviceId: d.id, slot: 0, now: T0, config: Config.defaults })
    return { deviceId: d.id, reservationId: a!.reservationId, fence: a!.fence, now: T0 + 1 }
  })

describe("a progress batch costs O(1) round trips, whatever its size", () => {
  it.live("postgres: one query on the wire for a batch that starts where the timeline ends or resends its last events first", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const wire = capturing(urlFor(inject("pgUrl"), name))
      const store = yield* Effect.provide(PgStore.make, yield* Layer.build(wire.layer))
      const auth = yield* reserved(store)
      const sent = (n: number) => wire.sent.length - n
      let before = wire.sent.length
      const fresh = yield* store.appendProgress(auth, progress(1, 500))
      expect(fresh.results.every((r) => r.status === "accepted")).toBe(true)
      expect(sent(before)).toBe(1)
      before = wire.sent.length
      const half = yield* store.appendProgress({ ...auth, now: T0 + 2 }, progress(251, 500))
      expect(half.results.filter((r) => r.status === "duplicate")).toHaveLength(250)
      expect(half.assignment.lastSeq).toBe(750)
      expect(sent(before)).toBe(1)
      before = wire.sent.length
      const again = yield* store.appendProgress({ ...auth, now: T0 + 3 }, progress(1, 750))
      expect(again.results.every((r) => r.status === "duplicate")).toBe(true)
      expect(sent(before)).toBe(1)
    }).pipe(Effect.scoped))

  it.live("sqlite: one transaction of prepared statements for a fresh batch and for one that resends accepted events; none compiled per call", () =>
    Effect.gen(function* () {
      const store = yield* Store.Store
      const auth = yield* reserved(store)
      const fresh = yield* countStatements(store.appendProgress(auth, progress(1, 500)))
      expect(fresh.value.assignment.lastSeq).toBe(500)
      expect(fresh.statements).toBe(0)
      const half = yield* countStatements(store.appendProgress({ ...auth, now: T0 + 2 }, progress(251, 500)))
      expect(half.value.results.filter((r) => r.status === "duplicate")).toHaveLength(250)
      expect(half.value.results.filter((r) => r.status === "accepted")).toHaveLength(250)
      expect(half.statements).toBe(0)
    }).pipe(Effect.provide(freshSqlite())))
})

describe("a result costs a constant number of statements, whatever the timeline's length", () => {
  it.live("sqlite: one transaction of prepared statements for an accepted result and for a resubmission; none compiled per call", () =>
    Effect.gen(function* () {
      const store = yield* Store.Store
      const auth = yield* reserved(store)
      yield* store.appendProgress(auth, progress(1, 500))
      const result = { ...auth, now: T0 + 2, outcome: "clean" as const, finalPhase: "staging" as const, body: "{}" }
      const first = yield* countStatements(store.submitResult(result))
      expect(first.value.acceptedAt).toBe(T0 + 2)
      expect(first.statements).toBe(0)
      const again = yield* countStatements(store.submitResult({ ...result, now: T0 + 3 }))
      expect(again.value).toEqual(first.value)
      expect(again.statements).toBe(0)
    }).pipe(Effect.provide(freshSqlite())))
})

describe("a result with its slot's next claim is one round trip", () => {
  it.live("postgres: one query on the wire accepts the result and claims the slot again, and one when nothing is left to claim", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const wire = capturing(urlFor(inject("pgUrl"), name))
      const store = yield* Effect.provide(PgStore.make, yield* Layer.build(wire.layer))
      const auth = yield* reserved(store)
      yield* store.recordObservations([{ source: "github", identity: "next", remoteAt: null }], T0)
      const result = (a: Store.Authority) => ({ ...a, outcome: "clean" as const, finalPhase: null, body: "{}" })
      let before = wire.sent.length
      const first = yield* store.submitResultAndClaim(result(auth), { slot: 0, config: Config.defaults })
      expect(first.receipt.reservationId).toBe(auth.reservationId)
      expect(first.next).toMatchObject({ identity: "next", slot: 0, issuedAt: auth.now })
      expect(wire.sent.length - before).toBe(1)
      before = wire.sent.length
      const last = yield* store.submitResultAndClaim(result({ deviceId: auth.deviceId, reservationId: first.next!.reservationId, fence: first.next!.fence, now: T0 + 2 }), {
        slot: 0,
        config: Config.defaults
      })
      expect(last).toMatchObject({ receipt: { reservationId: first.next!.reservationId }, next: null, claimRefused: null })
      expect(wire.sent.length - before).toBe(1)
    }).pipe(Effect.scoped))

  it.live("sqlite: prepared statements for the pair, and for one whose claim is refused; none compiled per call", () =>
    Effect.gen(function* () {
      const store = yield* Store.Store
      const auth = yield* reserved(store)
      yield* store.recordObservations([{ source: "github", identity: "next", remoteAt: null }], T0)
      const result = (a: Store.Authority) => ({ ...a, outcome: "clean" as const, finalPhase: null, body: "{}" })
      const first = yield* countStatements(store.submitResultAndClaim(result(auth), { slot: 0, config: Config.defaults }))
      expect(first.value.next).toMatchObject({ identity: "next", slot: 0 })
      expect(first.statements).toBe(0)
      const next = first.value.next!
      const refused = yield* countStatements(
        store.submitResultAndClaim(result({ deviceId: auth.deviceId, reservationId: next.reservationId, fence: next.fence, now: T0 + 2 }), { slot: 1, config: Config.defaults })
      )
      expect(refused.value).toMatchObject({ receipt: { reservationId: next.reservationId }, next: null, claimRefused: { reason: "capacity" } })
      expect(refused.statements).toBe(0)
    }).pipe(Effect.provide(freshSqlite())))
})

describe("concurrent claims merge whenever their configurations are equal, not only when they are one object", () => {
  it.live("postgres: 8 claims with 8 copies of one configuration (as a server reads it afresh for each request) take at most 2 statements", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const wire = capturing(urlFor(inject("pgUrl"), name), 10)
      const store = yield* Effect.provide(PgStore.make, yield* Layer.build(wire.layer))
      const devices = yield* Effect.forEach(Array.from({ length: 8 }, (_, i) => i), (i) => store.addDevice({ name: `copy-${i}`, slots: 2, tokenHash: `copy-${i}`, now: T0 }))
      yield* store.recordObservations(Array.from({ length: 20 }, (_, i) => ({ source: "github" as const, identity: `copies/${i}`, remoteAt: null })), T0)
      // the configuration's policies interned once, by content
      yield* store.claim({ deviceId: devices[0].id, slot: 1, now: T0, config: structuredClone(Config.defaults) })
      const claims = (slot: number) => devices.map((d) => store.claim({ deviceId: d.id, slot, now: T0 + 1, config: structuredClone(Config.defaults) }))
      const before = wire.sent.length
      const claimed = yield* Effect.all(claims(0), { concurrency: "unbounded" })
      expect(claimed.every((a) => a !== null)).toBe(true)
      expect(new Set(claimed.map((a) => a!.targetId)).size).toBe(8)
      expect(wire.sent.length - before).toBeLessThanOrEqual(2)
    }).pipe(Effect.scoped))
})
