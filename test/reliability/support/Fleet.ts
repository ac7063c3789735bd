import { PgStore } from "@scanfleet/adapters"
import { Config, type Source, Store } from "@scanfleet/core"
import { Effect, Layer, ManagedRuntime, Redacted } from "effect"
import { adminToken, call } from "./Procs.js"

/**
 * Operator actions against a running server (admin API over HTTP) and direct
 * reads and seeds of its Postgres store from the test process.
 */

/** Registers a device over the admin API; resolves to its id and token. */
export const addDevice = async (url: string, name: string, slots = 2): Promise<{ id: number; token: string }> => {
  const r = await call(url, "POST", "/v1/admin/devices", { token: adminToken, body: { name, slots } })
  if (r.status !== 201) throw new Error(`device registration failed: ${r.status} ${r.text}`)
  return { id: r.body.device.id, token: r.body.token }
}

/** Applies a managed configuration with the given github scan/upload timeouts, global TTL and handoff margin (seconds); the other sources keep long TTLs under overrides. */
export const applyConfig = async (url: string, p: { readonly scan: number; readonly upload: number; readonly ttl: number; readonly margin?: number; readonly maxAttempts?: number }) => {
  const doc: Config.ManagedConfig = {
    ...Config.defaults,
    assignments: { ...Config.defaults.assignments, globalTtlSeconds: p.ttl, handoffMarginSeconds: p.margin ?? 1, overrides: { gitlab: { ttlSeconds: 7200 }, huggingface: { ttlSeconds: 7200 }, dockerhub: { ttlSeconds: 7200 } } },
    expiry: { ...Config.defaults.expiry, ...(p.maxAttempts !== undefined ? { maxAttempts: p.maxAttempts } : {}) },
    sources: { ...Config.defaults.sources, github: { ...Config.defaults.sources.github, scanTimeoutSeconds: p.scan, uploadTimeoutSeconds: p.upload } }
  }
  const r = await call(url, "POST", "/v1/admin/config/apply", { token: adminToken, body: doc })
  if (r.status !== 201) throw new Error(`config apply failed: ${r.status} ${r.text}`)
  return doc
}

/** A Store on the same database, in this process, for seeding and inspection. */
export const storeOn = (databaseUrl: string) => {
  const rt = ManagedRuntime.make(PgStore.layer({ url: Redacted.make(databaseUrl), maxConnections: 4 }) as Layer.Layer<Store.Store, unknown>)
  const run = <A, E>(f: (s: Store.StoreShape) => Effect.Effect<A, E>) => rt.runPromise(Effect.flatMap(Store.Store, f))
  return {
    run,
    seed: (identities: ReadonlyArray<string>, source: Source.Source = "github") =>
      run((s) => s.recordObservations(identities.map((identity) => ({ source, identity, remoteAt: null })), Date.now())),
    close: () => rt.dispose()
  }
}
