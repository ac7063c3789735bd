import { afterEach } from "vitest"

/**
 * What a test started (servers, devices, proxies), ended after it in the
 * reverse order: the returned `defer` adds to it.
 */
export const useCleanups = (): ((cleanup: () => Promise<unknown>) => void) => {
  const cleanups: Array<() => Promise<unknown>> = []
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c()
  })
  return (cleanup) => void cleanups.push(cleanup)
}
