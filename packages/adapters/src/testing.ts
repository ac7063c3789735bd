/**
 * @scanfleet/adapters/testing: what a third party needs to test its own
 * storage adapter or discovery code. The conformance suite and the
 * model-based test run under vitest with @effect/vitest (optional peer
 * dependencies of this package); the fake sources need neither.
 *
 * @example
 * import { Conformance } from "@scanfleet/adapters/testing"
 * Conformance.conformance("my store", () => MyStore.layer(settings), { concurrency: true })
 */
export * as Conformance from "./Conformance.js"
export * as FakeSources from "./testing/FakeSources.js"
export * as ModelTest from "./internal/ModelTest.js"
