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

/**
 * The worker's own Node entries (the execution unit, the demo scanner) run as a
 * process of their own for every scan, so they are built apart, as one file
 * each with their dependencies in it (one ESM file parsed, not the hundreds
 * behind `effect`'s and core's index): about 0.25 s of CPU to start instead
 * of about 0.95 s. Nobody imports them, so neither types nor CommonJS. They are
 * written next to the package's index, which `ExecutionUnit` looks beside
 * itself for; the package's own build, running at the same time, leaves them
 * out of its clean.
 */
const standalone = { unit: "packages/worker/src/unit/main.ts", "demo-scanner": "packages/worker/src/unit/demo-scanner.ts" }
const workerEntries: Options = {
  name: "worker-entries",
  entry: standalone,
  outDir: "packages/worker/dist",
  format: ["esm"],
  dts: false,
  tsconfig: `tsconfig.build.json`,
  // 2.5 MB for the unit's map alone, and Node reads none without --enable-source-maps
  sourcemap: false,
  clean: false,
  splitting: false,
  target: "node20",
  platform: "node",
  noExternal: [/^[^./]/],
  // core from its source: its own build, which would be read, runs at the same time
  esbuildOptions: (o) => {
    o.conditions = ["@scanfleet/source"]
  }
}

export default defineConfig([
  pkg("core", { index: "packages/core/src/index.ts" }),
  pkg("adapters", {
    index: "packages/adapters/src/index.ts",
    testing: "packages/adapters/src/testing.ts",
    FakeSources: "packages/adapters/src/testing/FakeSources.ts",
    Conformance: "packages/adapters/src/Conformance.ts"
  }),
  { ...pkg("worker", { index: "packages/worker/src/index.ts", bin: "packages/worker/src/bin.ts" }), clean: Object.keys(standalone).map((name) => `!${name}.js`) },
  workerEntries,
  pkg("server-example", { index: "packages/server-example/src/index.ts", bin: "packages/server-example/src/bin.ts" })
])
