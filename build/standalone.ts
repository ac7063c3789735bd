import type { Options } from "tsup"

/**
 * How a Node entry that runs as a process of its own is built: the CLIs, the
 * execution unit a scan runs in, the demo scanner, and the tests' copies of
 * them. One ESM file with every JavaScript dependency in it, so a start parses
 * one file instead of resolving and loading the hundreds of modules behind
 * `effect`'s, `@effect/*`'s and the packages' indexes: `scanfleet-server
 * --version` takes about 0.85 s of CPU this way against 3.0 s with its
 * dependencies left to node_modules.
 *
 * Left out, and resolved from node_modules beside the file at run time: the
 * native SQLite binding (a compiled addon, which every package with such an
 * entry declares as a dependency of its own, so it is found from the package
 * however npm lays the tree out) and the optional native helpers of `pg` and
 * `ws`, which those load only when present. CommonJS dependencies bundled into
 * ESM still call `require` for Node's builtins, hence the banner.
 */
export const nativeAddons = ["better-sqlite3"]
export const optionalNative = ["pg-native", "bufferutil", "utf-8-validate"]
const left = [...nativeAddons, ...optionalNative]
// tsup bundles whatever `noExternal` matches, whatever `external` says
const bundled = new RegExp(`^(?!(?:${left.join("|")})(?:/|$))[^./]`)

/**
 * The packages' standalone entries, written next to each package's index:
 * `ExecutionUnit` looks beside itself for the unit, and the committed bin shims
 * import `dist/bin.js`.
 */
export const entries = {
  worker: {
    bin: "packages/worker/src/bin.ts",
    unit: "packages/worker/src/unit/main.ts",
    "demo-scanner": "packages/worker/src/unit/demo-scanner.ts"
  },
  "server-example": { bin: "packages/server-example/src/bin.ts" }
} as const satisfies Record<string, Record<string, string>>

export const standalone = (name: string, entry: Record<string, string>, outDir: string): Options => ({
  name,
  entry,
  outDir,
  format: ["esm"],
  // nothing imports these files: no types, no CommonJS; and no source maps, which
  // Node reads only under --enable-source-maps (2.5 MB for the unit's alone)
  dts: false,
  sourcemap: false,
  clean: false,
  splitting: false,
  target: "node20",
  platform: "node",
  noExternal: [bundled],
  external: left,
  banner: { js: `import { createRequire as __scanfleetCreateRequire } from "node:module"; const require = __scanfleetCreateRequire(import.meta.url);` },
  // keep the `node:` of builtins: `node:sqlite`, which undici looks for, has no name without it
  removeNodeProtocol: false,
  // the workspace packages from their source: their own builds run at the same time
  esbuildOptions: (o) => {
    o.conditions = ["@scanfleet/source"]
  }
})
