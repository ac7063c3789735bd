import { Config, Store } from "@scanfleet/core"
import { Effect } from "effect"
import { fromStoreError } from "../ApiError.js"

/** The managed configuration in force: the last applied version, else core's defaults. */
export const current = Effect.flatMap(Store.Store, (store) =>
  store.activeConfig().pipe(
    Effect.map((v) => ({ document: v ? v.document : Config.defaults, version: v })),
    Effect.mapError(fromStoreError)
  )
)
