import { Config, MemoryStore, type Operations, Store } from "@scanfleet/core"
import { Context, Duration, Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Controls from "../src/Controls.js"
import { type Running, start } from "./fixtures/Harness.js"

// The memory store, with its reads of the configuration in force counted.
const reads = { count: 0 }
const counted = Layer.effectContext(
  Effect.map(Effect.context<Store.Store | Operations.Operations>(), (ctx) => {
    const store = Context.get(ctx, Store.Store)
    return Context.add(ctx, Store.Store, { ...store, activeConfig: () => Effect.suspend(() => (reads.count++, store.activeConfig())) })
  })
).pipe(Layer.provide(MemoryStore.layer))

const withTtl = (ttlSeconds: number): Config.ManagedConfig => ({ ...Config.defaults, assignments: { ...Config.defaults.assignments, globalTtlSeconds: ttlSeconds } })

describe("the configuration in force, as an instance's claims read it", () => {
  let s: Running
  let device: { id: number; token: string }
  let seq = 0
  beforeAll(async () => {
    // The sweeper reads the configuration on each sweep: once at start, then not within the tests.
    s = await start({ storeLayer: counted, sweepIntervalMs: 600_000 })
    device = await s.addDevice("claims", 64)
  })
  afterAll(async () => {
    await s?.close()
  })

  // Claims a fresh github target on the next free slot and gives its policy's TTL back.
  const claimTtl = async () => {
    await s.run(Effect.suspend(() => s.store.recordObservations([{ source: "github", identity: `in-force/${++seq}`, remoteAt: null }], Date.now())))
    const r = await s.device(device.token, "POST", "/v1/assignments/claim", { slot: seq - 1 })
    expect(r.status, JSON.stringify(r.body)).toBe(200)
    expect(r.body.assignment.target.identity).toBe(`in-force/${seq}`)
    return r.body.assignment.policy.ttlSeconds as number
  }

  it("claims cost no read of the configuration each: 20 claims in a row read it at most once", async () => {
    const before = reads.count
    for (let i = 0; i < 20; i++) await claimTtl()
    expect(reads.count - before).toBeLessThanOrEqual(1)
  })

  it("a configuration applied through this instance's admin API governs its very next claim", async () => {
    expect(await claimTtl()).toBe(Config.defaults.assignments.globalTtlSeconds)
    const r = await s.admin("POST", "/v1/admin/config/apply", withTtl(4321))
    expect(r.status, JSON.stringify(r.body)).toBe(201)
    expect(await claimTtl()).toBe(4321)
  })

  it("one applied by another instance (straight into the shared store) governs this instance's claims once Controls.cacheTtl has passed", async () => {
    await claimTtl()
    await s.run(Effect.suspend(() => s.store.applyConfig(withTtl(5432), "another instance", Date.now())))
    await new Promise((r) => setTimeout(r, Duration.toMillis(Controls.cacheTtl) + 100))
    expect(await claimTtl()).toBe(5432)
  })
})
