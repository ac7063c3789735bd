import { type Config, type Errors, Operations, Store } from "@scanfleet/core"
import { Effect } from "effect"

/**
 * The operator writes that go through the Store port rather than Operations, each followed by its
 * audit entry: the admin API and the command line both call these, so neither leaves one out.
 */

/** Stores a valid document as the next configuration version, audited as `apply_config`. */
export const applyConfig = (doc: Config.ManagedConfig, who: string, now: number): Effect.Effect<Store.ConfigVersion, Errors.StoreError, Store.Store | Operations.Operations> =>
  Effect.gen(function* () {
    const v = yield* (yield* Store.Store).applyConfig(doc, who, now)
    yield* (yield* Operations.Operations).audit("apply_config", "config", { version: v.version }, { who, why: `version ${v.version}`, now })
    return v
  })

/** Registers a device (its token already hashed), audited as `register_device`. */
export const addDevice = (
  input: { readonly name: string; readonly slots: number; readonly tokenHash: string },
  who: string,
  now: number
): Effect.Effect<Store.Device, Errors.StoreError, Store.Store | Operations.Operations> =>
  Effect.gen(function* () {
    const d = yield* (yield* Store.Store).addDevice({ ...input, now })
    yield* (yield* Operations.Operations).audit("register_device", `device:${d.id}`, { name: d.name, slots: d.slots }, { who, why: "registered", now })
    return d
  })
