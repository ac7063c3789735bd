import { defineConfig, type Options } from "tsup"

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

export default defineConfig([
  pkg("core", { index: "packages/core/src/index.ts" }),
  pkg("adapters", {
    index: "packages/adapters/src/index.ts",
    testing: "packages/adapters/src/testing.ts",
    FakeSources: "packages/adapters/src/testing/FakeSources.ts",
    Conformance: "packages/adapters/src/Conformance.ts"
  }),
  pkg("worker", { index: "packages/worker/src/index.ts", bin: "packages/worker/src/bin.ts", unit: "packages/worker/src/unit/main.ts", "demo-scanner": "packages/worker/src/unit/demo-scanner.ts" }),
  pkg("server-example", { index: "packages/server-example/src/index.ts", bin: "packages/server-example/src/bin.ts" })
])
