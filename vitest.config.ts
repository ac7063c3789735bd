import { fileURLToPath } from "node:url"
import { defineConfig } from "vitest/config"

const src = (name: string) => fileURLToPath(new URL(`./packages/${name}/src/index.ts`, import.meta.url))

export default defineConfig({
  resolve: {
    alias: {
      "@scanfleet/core": src("core"),
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
