import { fileURLToPath } from "node:url"
import { defineConfig } from "vitest/config"

const src = (name: string) => fileURLToPath(new URL(`./packages/${name}/src/index.ts`, import.meta.url))

export default defineConfig({
  resolve: {
    alias: {
      "@scanfleet/core": src("core"),
      // listed before the package itself: the first alias whose prefix matches wins
      "@scanfleet/adapters/Conformance": fileURLToPath(new URL("./packages/adapters/src/Conformance.ts", import.meta.url)),
      "@scanfleet/adapters/testing/FakeSources": fileURLToPath(new URL("./packages/adapters/src/testing/FakeSources.ts", import.meta.url)),
      "@scanfleet/adapters/testing": fileURLToPath(new URL("./packages/adapters/src/testing.ts", import.meta.url)),
      "@scanfleet/adapters": src("adapters"),
      "@scanfleet/worker": src("worker"),
      "@scanfleet/server-example": src("server-example")
    }
  },
  test: {
    include: ["packages/*/test/**/*.test.ts", "test/**/*.test.ts"],
    globalSetup: ["./test/globalSetup.ts"],
    pool: "forks",
    testTimeout: 60_000,
    hookTimeout: 120_000,
    reporters: ["default"]
  }
})
