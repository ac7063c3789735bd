import { Store } from "@scanfleet/core"
import { Effect } from "effect"
import { type ApiError, fromStoreError } from "../ApiError.js"

/**
 * The managed configuration in force, read now: the last applied version, else core's defaults.
 * Claims read it through `Controls.inForce`, a copy kept for a second.
 */
export const current: Effect.Effect<Store.InForce, ApiError, Store.Store> = Effect.flatMap(Store.Store, (store) =>
  store.activeConfig().pipe(Effect.map(Store.inForce), Effect.mapError(fromStoreError))
)
