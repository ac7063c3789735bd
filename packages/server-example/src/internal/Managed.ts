import { Config, Store } from "@scanfleet/core"
import { Effect } from "effect"
import { type ApiError, fromStoreError } from "../ApiError.js"

/** The managed configuration in force: the last applied version, else core's defaults. */
export const current: Effect.Effect<{ readonly document: Config.ManagedConfig; readonly version: Store.ConfigVersion | null }, ApiError, Store.Store> = Effect.flatMap(Store.Store, (store) =>
  store.activeConfig().pipe(
    Effect.map((v) => ({ document: v ? v.document : Config.defaults, version: v })),
    Effect.mapError(fromStoreError)
  )
)
