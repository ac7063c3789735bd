import { mkdirSync, writeFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import { bundleEntry } from "./Controller.js"

/**
 * The execution unit and the TypeScript scanners tests run, bundled from
 * source once per test process into the package's `.test-build/`, where a
 * bundled controller finds them as the built package finds `dist/unit.js`.
 */
const outDir = fileURLToPath(new URL("../../.test-build/", import.meta.url))
const src = (rel: string) => fileURLToPath(new URL(rel, import.meta.url))

let built: Promise<void> | null = null

/** Bundles the unit, the demo scanner and the adversarial scanners (once per process). */
export const build = (): Promise<void> =>
  (built ??= (async () => {
    mkdirSync(outDir, { recursive: true })
    await bundleEntry(src("../../src/unit/main.ts"), "unit", outDir, { standalone: true })
    await bundleEntry(src("../../src/unit/demo-scanner.ts"), "demo-scanner", outDir, { standalone: true })
    // bundleEntry leaves every bundle executable: fake-trufflehog runs as a command of its own, as the real binary is.
    for (const name of adversaries) await bundleEntry(src(`../fixtures/adversarial/${name}.ts`), name, `${outDir}adversarial/`)
  })())

/** The bundled unit script. */
export const unitPath = `${outDir}unit.js`

/** The scanners under test/fixtures/adversarial (the hostile ones, and a few plain ones). */
export const adversaries = ["restart-on-term", "daemonize", "term-trap", "hold-stdout", "flood", "blocked-cleanup", "exit-code", "fake-trufflehog", "flood-controller", "clean-on-term", "leftover-writer", "stop-unit", "many-files", "sleepy"] as const

/** The bundled path of one adversarial scanner. */
export const adversary = (name: (typeof adversaries)[number]): string => `${outDir}adversarial/${name}.js`

/**
 * Writes a command scanner document for the sleepy scanner to `file` and returns its `--scanner` value:
 * it records its pid in `pidFile`, scans for `ms`, prints one finding naming its target and exits 3 (findings).
 */
export const sleepyScanner = (file: string, pidFile: string, ms: number): string => {
  writeFileSync(file, JSON.stringify({ name: "sleepy", command: process.execPath, args: [adversary("sleepy"), pidFile, String(ms), "{identity}"], exitCodes: { "0": "clean", "3": "findings" } }))
  return `command:${file}`
}
