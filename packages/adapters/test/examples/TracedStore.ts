import { Effect, Layer } from "effect"
import { Store } from "@scanfleet/core"

/**
 * An example third-party adapter: a decorator that wraps every operation of
 * the Store underneath in a tracing span. Small as it is, it must keep every
 * promise of the port, so it runs the conformance suite like any backend.
 */
export const traced = (inner: Store.StoreShape): Store.StoreShape => {
  const wrap =
    <Args extends ReadonlyArray<unknown>, A, E>(name: string, f: (...args: Args) => Effect.Effect<A, E>) =>
    (...args: Args) =>
      Effect.withSpan(f(...args), `store.${name}`)
  return {
    recordObservations: wrap("recordObservations", inner.recordObservations),
    promote: wrap("promote", inner.promote),
    claim: wrap("claim", inner.claim),
    claimMany: wrap("claimMany", inner.claimMany),
    appendProgress: wrap("appendProgress", inner.appendProgress),
    submitResult: wrap("submitResult", inner.submitResult),
    submitResults: wrap("submitResults", inner.submitResults),
    submitResultAndClaim: wrap("submitResultAndClaim", inner.submitResultAndClaim),
    release: wrap("release", inner.release),
    expireDue: wrap("expireDue", inner.expireDue),
    getAssignment: wrap("getAssignment", inner.getAssignment),
    listAssignments: wrap("listAssignments", inner.listAssignments),
    timeline: wrap("timeline", inner.timeline),
    getTarget: wrap("getTarget", inner.getTarget),
    countTargets: wrap("countTargets", inner.countTargets),
    countAssignments: wrap("countAssignments", inner.countAssignments),
    cycleTotals: wrap("cycleTotals", inner.cycleTotals),
    recordCycle: wrap("recordCycle", inner.recordCycle),
    listCycles: wrap("listCycles", inner.listCycles),
    recordDurations: wrap("recordDurations", inner.recordDurations),
    percentiles: wrap("percentiles", inner.percentiles),
    activeConfig: wrap("activeConfig", inner.activeConfig),
    applyConfig: wrap("applyConfig", inner.applyConfig),
    addDevice: wrap("addDevice", inner.addDevice),
    deviceByTokenHash: wrap("deviceByTokenHash", inner.deviceByTokenHash),
    revokeDevice: wrap("revokeDevice", inner.revokeDevice),
    reportDevice: wrap("reportDevice", inner.reportDevice),
    fleet: wrap("fleet", inner.fleet)
  }
}

/** Replaces the Store in context with its traced version. */
export const layer: Layer.Layer<Store.Store, never, Store.Store> = Layer.effect(Store.Store, Effect.map(Store.Store, traced))
