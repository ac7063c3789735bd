import { describe, expect, it } from "@effect/vitest"
import { Config, Errors, Store } from "@scanfleet/core"
import { Duration, Effect, Layer } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { conformance } from "../src/Conformance.js"
import * as Fleet from "../src/Fleet.js"

// The Promise API passes the Store port's conformance suite: each test opens a
// fleet, and a thin adapter turns its Promises back into the port's Effects
// (a rejection becomes the failure, so the suite sees the same tagged errors).
const asStore = (p: Fleet.PromiseStore): Store.StoreShape =>
  Object.fromEntries(
    Object.entries(p).map(([name, f]) => [name, (...args: Array<unknown>) => Effect.tryPromise({ try: () => (f as (...a: Array<unknown>) => Promise<unknown>)(...args), catch: (e) => e })])
  ) as unknown as Store.StoreShape

const fleetLayer = (database: () => { readonly url: string; readonly cleanup: () => void }) => () =>
  Layer.scoped(
    Store.Store,
    Effect.map(
      Effect.acquireRelease(
        Effect.promise(async () => {
          const db = database()
          return { db, fleet: await Fleet.openFleet({ database: db.url }) }
        }),
        ({ db, fleet }) => Effect.promise(() => fleet.close().finally(db.cleanup))
      ),
      ({ fleet }) => asStore(fleet.store)
    )
  )

const sqliteFile = () => {
  const dir = mkdtempSync(join(tmpdir(), "scanfleet-fleet-"))
  return { url: `sqlite:${join(dir, "queue.db")}`, cleanup: () => rmSync(dir, { recursive: true, force: true }) }
}

conformance("the Promise API (openFleet) over a SQLite file", fleetLayer(sqliteFile), { concurrency: false, modelRuns: 3 })
conformance("the Promise API (openFleet) in memory", fleetLayer(() => ({ url: "memory:", cleanup: () => {} })), { concurrency: false, modelRuns: 3 })

describe("openFleet", () => {
  it("refuses a database URL with a scheme it has no backend for, as a DatabaseUrlError", async () => {
    const e = await Fleet.openFleet({ database: "mysql://x" }).then(
      () => null,
      (e: unknown) => e
    )
    expect(e).toBeInstanceOf(Error)
    expect(e).toBeInstanceOf(Fleet.DatabaseUrlError)
    expect(e).toMatchObject({ _tag: "DatabaseUrlError", reason: "unsupported_scheme" })
  })

  it("rejects a refused call with the port's own Error subclass and reason; the defaults fill now and config, in a result with its next claim too", async () => {
    const db = sqliteFile()
    const fleet = await Fleet.openFleet({ database: db.url })
    try {
      const device = await fleet.store.addDevice({ name: "d", slots: 1, tokenHash: "h", now: Date.now() })
      await fleet.recordObservations([{ source: "github", identity: "a/b", remoteAt: Date.now() - 60_000 }])
      const a = await fleet.claim({ deviceId: device.id, slot: 0 })
      expect(a).not.toBeNull()
      expect(a!.policy).toEqual(Config.effectivePolicy(Config.defaults, "github"))
      await fleet.recordObservations([{ source: "github", identity: "c/d", remoteAt: null }])
      const busy = await fleet.claim({ deviceId: device.id, slot: 0 }).catch((e: unknown) => e)
      expect(busy).toBeInstanceOf(Error)
      expect(busy).toBeInstanceOf(Errors.ClaimRejected)
      expect(busy).toMatchObject({ reason: "slot_busy" })
      const stale = await fleet.submitResult({ deviceId: device.id, reservationId: a!.reservationId, fence: a!.fence + 1, outcome: "clean", finalPhase: null, body: "{}" }).catch((e: unknown) => e)
      expect(stale).toBeInstanceOf(Fleet.ReservationRefused)
      expect(stale).toMatchObject({ reason: "stale_fence" })
      const done = await fleet.submitResultAndClaim({ deviceId: device.id, reservationId: a!.reservationId, fence: a!.fence, outcome: "clean", finalPhase: null, body: "{}" }, { slot: 0 })
      expect(done.receipt.reservationId).toBe(a!.reservationId)
      expect(done.next).toMatchObject({ identity: "c/d", slot: 0, policy: Config.effectivePolicy(Config.defaults, "github") })
      expect(done.claimRefused).toBeNull()
      // a refused claim resolves: the result stands, and the refusal says why
      const outside = await fleet.submitResultAndClaim({ deviceId: device.id, reservationId: done.next!.reservationId, fence: done.next!.fence, outcome: "clean", finalPhase: null, body: "{}" }, { slot: 1 })
      expect(outside.claimRefused).toBeInstanceOf(Errors.ClaimRejected)
      expect(outside).toMatchObject({ receipt: { reservationId: done.next!.reservationId }, next: null, claimRefused: { reason: "capacity" } })
    } finally {
      await fleet.close()
      db.cleanup()
    }
    await expect(fleet.promote("github", { budget: 1, cooldownMs: 0 })).rejects.toMatchObject({ _tag: "StoreError", reason: "unavailable" })
  })

  it("claims follow the configuration in force: one applied through this fleet from the next claim, one applied by another process within Store.inForceTtl", async () => {
    const db = sqliteFile()
    const fleet = await Fleet.openFleet({ database: db.url })
    const other = await Fleet.openFleet({ database: db.url })
    try {
      const device = await fleet.store.addDevice({ name: "d", slots: 8, tokenHash: "h", now: Date.now() })
      let slot = 0
      const ttl = async () => {
        await fleet.recordObservations([{ source: "github", identity: `in-force/${slot}`, remoteAt: null }])
        const a = await fleet.claim({ deviceId: device.id, slot: slot++ })
        return a!.policy.ttlSeconds
      }
      const withTtl = (ttlSeconds: number): Config.ManagedConfig => ({ ...Config.defaults, assignments: { ...Config.defaults.assignments, globalTtlSeconds: ttlSeconds } })
      expect(await ttl()).toBe(Config.defaults.assignments.globalTtlSeconds)
      await fleet.store.applyConfig(withTtl(4321), "here", Date.now())
      expect(await ttl()).toBe(4321)
      await other.store.applyConfig(withTtl(5432), "another process", Date.now())
      await new Promise((r) => setTimeout(r, Duration.toMillis(Store.inForceTtl) + 100))
      expect(await ttl()).toBe(5432)
    } finally {
      await other.close()
      await fleet.close()
      db.cleanup()
    }
  })
})
