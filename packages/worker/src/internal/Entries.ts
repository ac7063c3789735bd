import { existsSync } from "node:fs"
import { fileURLToPath } from "node:url"

/**
 * The package's own Node entries (the execution unit, the demo scanner),
 * built by tsup next to the package's index. From the built package they sit
 * beside this code; from source or a test bundle, in the package's `dist/`.
 */
export const entry = (name: "unit" | "demo-scanner"): string => {
  const candidates = [`./${name}.js`, `../dist/${name}.js`, `../../dist/${name}.js`].map((rel) => fileURLToPath(new URL(rel, import.meta.url)))
  const found = candidates.find((p) => existsSync(p))
  if (found === undefined) throw new Error(`the worker's ${name} entry is not built (looked in ${candidates.join(", ")}); run \`npm run build\``)
  return found
}
