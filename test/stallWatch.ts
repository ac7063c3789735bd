import { beforeEach, expect } from "vitest"

/**
 * Names the test file and test when a test worker's event loop stalls.
 *
 * vitest's worker answers its runner over an RPC channel with a fixed 60 s
 * timeout; a worker whose event loop is held longer (a synchronous spawn, a
 * synchronous removal of a large tree, a long synchronous property) fails the
 * whole run with `Timeout calling "onTaskUpdate"` and names no test. This
 * writes straight to the worker's stderr (not through the RPC channel that is
 * stalled) as soon as the loop is free again, so such a run says where.
 */
const threshold = 10_000
const period = 1_000
let current = ""
beforeEach((ctx) => {
  current = ctx.task.name
})
const state = globalThis as { readonly __scanfleetStallWatch?: true }
if (!state.__scanfleetStallWatch) {
  Object.assign(globalThis, { __scanfleetStallWatch: true })
  let last = performance.now()
  setInterval(() => {
    const now = performance.now()
    const stalled = now - last - period
    last = now
    if (stalled > threshold)
      process.stderr.write(
        `[scanfleet tests] the event loop of the worker running ${expect.getState().testPath ?? "?"} (test: ${current || "a hook"}) was held for ${Math.round(stalled)} ms; vitest fails a run at 60,000\n`
      )
  }, period).unref()
}
