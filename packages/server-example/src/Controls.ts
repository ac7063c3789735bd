import { Operations, type Source } from "@scanfleet/core"
import { Context, Duration, Effect, Layer } from "effect"
import { type ApiError, fromStoreError } from "./ApiError.js"

/** How long a server instance serves claims from its copy of the paused sources and device filters. */
export const cacheTtl = Duration.seconds(1)

/**
 * The operator controls claims obey (paused sources, per-device claim filters), read through a
 * short cache so a claim costs no extra statement: a pause made on this instance applies to its
 * next claim, one made on another instance within `cacheTtl`.
 */
export class Controls extends Context.Tag("@scanfleet/server-example/Controls")<
  Controls,
  {
    /** The sources a device's claim may take (undefined: any), per `Operations.claimable`. */
    readonly claimable: (deviceId: number, asked: ReadonlyArray<Source.Source> | undefined) => Effect.Effect<ReadonlyArray<Source.Source> | undefined, ApiError>
    /** Drops the cached copy (after a change made here). */
    readonly invalidate: Effect.Effect<void>
  }
>() {}

/** The controls over the operator port in context. */
export const layer: Layer.Layer<Controls, never, Operations.Operations> = Layer.effect(
  Controls,
  Effect.gen(function* () {
    const ops = yield* Operations.Operations
    const load = Effect.all({ controls: ops.sourceControls(), filters: ops.deviceFilters() }).pipe(
      Effect.map(({ controls, filters }) => ({ controls, filters: new Map(filters.map((f) => [f.deviceId, f.sources])) })),
      Effect.mapError(fromStoreError)
    )
    const [cached, invalidate] = yield* Effect.cachedInvalidateWithTTL(load, cacheTtl)
    return {
      claimable: (deviceId, asked) => Effect.map(cached, (c) => Operations.claimable(asked, c.filters.get(deviceId) ?? null, c.controls)),
      invalidate
    }
  })
)
