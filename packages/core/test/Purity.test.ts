import { readdirSync, readFileSync } from "node:fs"
import { builtinModules } from "node:module"
import { join, relative } from "node:path"
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "@effect/vitest"

const srcDir = fileURLToPath(new URL("../src", import.meta.url))

const sourceFiles = (dir: string): Array<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sourceFiles(join(dir, e.name)) : /\.(c|m)?tsx?$/.test(e.name) ? [join(dir, e.name)] : []
  )

/** Every module specifier a file names: static imports and re-exports, dynamic imports, require calls. */
const specifiers = (code: string): Array<string> => {
  const out: Array<string> = []
  const patterns = [
    /\b(?:import|export)\s+(?:type\s+)?(?:[^'"`;]*?\s+from\s+)?["']([^"']+)["']/g,
    /\bimport\s*\(\s*["'`]([^"'`]+)["'`]\s*\)/g,
    /\brequire\s*\(\s*["'`]([^"'`]+)["'`]\s*\)/g
  ]
  for (const re of patterns) for (const m of code.matchAll(re)) out.push(m[1])
  return out
}

const forbidden = (spec: string): boolean =>
  spec.startsWith("node:") ||
  builtinModules.includes(spec.split("/")[0]) ||
  /^@effect\/(sql|platform)/.test(spec) ||
  spec === "execa" ||
  spec.startsWith("execa/")

/** What core may import: its own modules, effect and zod. */
const allowed = (spec: string): boolean => spec.startsWith("./") || spec.startsWith("../") || /^(effect|zod)(\/|$)/.test(spec)

describe("core purity", () => {
  it("the import scanner sees every form of import", () => {
    const sample = [
      `import { readFile } from "node:fs"`,
      `import type { SqlClient } from "@effect/sql"`,
      `export * from "@effect/platform-node"`,
      `const { execa } = await import("execa")`,
      `const cp = require("child_process")`,
      `import "fs"`,
      `import * as X from "./X.js"`
    ].join("\n")
    expect(specifiers(sample)).toEqual(["node:fs", "@effect/sql", "@effect/platform-node", "fs", "./X.js", "execa", "child_process"])
    expect(specifiers(sample).filter(forbidden)).toEqual(["node:fs", "@effect/sql", "@effect/platform-node", "fs", "execa", "child_process"])
  })

  it("packages/core/src imports nothing from node:*, @effect/sql*, @effect/platform* or execa", () => {
    const files = sourceFiles(srcDir)
    expect(files.length).toBeGreaterThan(10)
    const offences = files.flatMap((f) =>
      specifiers(readFileSync(f, "utf8"))
        .filter((s) => forbidden(s) || !allowed(s))
        .map((s) => `${relative(srcDir, f)}: ${s}`)
    )
    expect(offences).toEqual([])
  })

  it("core reads no clock of its own: time is always passed in as now", () => {
    const offences = sourceFiles(srcDir).flatMap((f) =>
      readFileSync(f, "utf8")
        .split("\n")
        .map((line, i) => ({ line, i }))
        // JSDoc examples may show a caller passing Date.now(); code may not call it.
        .filter(({ line }) => !/^\s*(\*|\/\/)/.test(line) && /\bDate\.now\(|\bnew Date\(\)|\bperformance\.now\(/.test(line))
        .map(({ i }) => `${relative(srcDir, f)}:${i + 1}`)
    )
    expect(offences).toEqual([])
  })
})
