import { defineConfig, type Options } from "tsup"
import { entries, standalone } from "./build/standalone.js"

// Every package builds the same way; bare imports (dependencies, sibling
// packages, node builtins) stay external so each package ships only its own code.
const pkg = (name: string, entry: Record<string, string>): Options => ({
  name,
  entry,
  outDir: `packages/${name}/dist`,
  format: ["esm", "cjs"],
  dts: true,
  tsconfig: `tsconfig.build.json`,
  sourcemap: true,
  clean: true,
  target: "node20",
  platform: "node",
  external: [/^[^./]/],
  shims: true
})

/** The packages' own builds, running beside their standalone entries' (build/standalone.ts), leave those out of their clean. */
const keep = (names: Record<string, string>) => Object.keys(names).map((name) => `!${name}.js`)

export default defineConfig([
  pkg("core", { index: "packages/core/src/index.ts" }),
  pkg("adapters", {
    index: "packages/adapters/src/index.ts",
    testing: "packages/adapters/src/testing.ts",
    FakeSources: "packages/adapters/src/testing/FakeSources.ts",
    Conformance: "packages/adapters/src/Conformance.ts"
  }),
  { ...pkg("worker", { index: "packages/worker/src/index.ts" }), clean: keep(entries.worker) },
  standalone("worker-entries", entries.worker, "packages/worker/dist"),
  { ...pkg("server-example", { index: "packages/server-example/src/index.ts" }), clean: keep(entries["server-example"]) },
  standalone("server-entries", entries["server-example"], "packages/server-example/dist")
])
