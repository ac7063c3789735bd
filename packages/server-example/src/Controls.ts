import { Operations, type Source, Store } from "@scanfleet/core"
import { Context, Effect, Layer } from "effect"
import { type ApiError, fromStoreError } from "./ApiError.js"

/** How long a server instance serves claims from its copy of the paused sources, device filters and configuration in force. */
export const cacheTtl = Store.inForceTtl

/**
 * What claims obey besides the store's own rules (paused sources, per-device claim filters, the
 * managed configuration in force), read through short caches so a claim costs no extra
 * statement: a change made on this instance applies to its next claim, one made on another
 * instance (or by the CLI) within `cacheTtl`.
 */
export class Controls extends Context.Tag("@scanfleet/server-example/Controls")<
  Controls,
  {
    /** The sources a device's claim may take (undefined: any), per `Operations.claimable`. */
    readonly claimable: (deviceId: number, asked: ReadonlyArray<Source.Source> | undefined) => Effect.Effect<ReadonlyArray<Source.Source> | undefined, ApiError>
    /** The managed configuration in force (`Store.configInForce`). */
    readonly inForce: Effect.Effect<Store.InForce, ApiError>
    /** Drops the cached copies (after a change made here). */
    readonly invalidate: Effect.Effect<void>
  }
>() {}

/** The controls over the operator and store ports in context. */
export const layer: Layer.Layer<Controls, never, Operations.Operations | Store.Store> = Layer.effect(
  Controls,
  Effect.gen(function* () {
    const ops = yield* Operations.Operations
    const load = Effect.all({ controls: ops.sourceControls(), filters: ops.deviceFilters() }).pipe(
      Effect.map(({ controls, filters }) => ({ controls, filters: new Map(filters.map((f) => [f.deviceId, f.sources])) })),
      Effect.mapError(fromStoreError)
    )
    const [cached, dropControls] = yield* Effect.cachedInvalidateWithTTL(load, cacheTtl)
    const config = yield* Store.configInForce(yield* Store.Store, cacheTtl)
    const invalidate = Effect.zipRight(dropControls, config.invalidate)
    return {
      // A failed read is not kept: the next claim reads again.
      claimable: (deviceId, asked) => Effect.map(Effect.tapError(cached, () => dropControls), (c) => Operations.claimable(asked, c.filters.get(deviceId) ?? null, c.controls)),
      inForce: Effect.mapError(config.current, fromStoreError),
      invalidate
    }
  })
)
