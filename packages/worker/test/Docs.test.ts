import { Scanner } from "@scanfleet/worker"
import { execa } from "execa"
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import ts from "typescript"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { bundleEntry } from "./support/Controller.js"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"

/**
 * The code blocks of docs/worker.md and packages/worker/README.md, run or
 * checked as written (only the server address is swapped for the test's).
 */
useNoOrphans()

const pkg = fileURLToPath(new URL("../", import.meta.url))
const repo = fileURLToPath(new URL("../../../", import.meta.url))
const fenced = (page: string, lang: string): Array<string> =>
  [...readFileSync(`${repo}${page}`, "utf8").matchAll(new RegExp("```" + lang + "\\n([\\s\\S]*?)```", "g"))].map((m) => m[1])

// One level under the package, where a bundle finds runtime/ as the built package does.
const scratch = `${pkg}.test-docs/`
afterAll(() => rmSync(scratch, { recursive: true, force: true }))

const [runner, device] = fenced("packages/worker/README.md", "ts")
// Bundled before any test starts: the bundler's helper process belongs to the file, not to a test.
beforeAll(async () => {
  mkdirSync(scratch, { recursive: true })
  writeFileSync(`${scratch}my-runner.js`, ts.transpileModule(runner, { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText)
  // The one change: the server address, which only the test knows.
  writeFileSync(`${scratch}device.ts`, device.replace('"http://127.0.0.1:8080"', "process.env.SCANFLEET_DOCS_SERVER!"))
  await bundleEntry(`${scratch}device.ts`, "device", scratch)
}, 120_000)

describe("the worker's documentation", () => {
  it("docs/worker.md: the trufflehog document is exactly what Scanner.trufflehog() ships", () => {
    const [doc] = fenced("docs/worker.md", "json")
    expect(Scanner.CommandSpecSchema.parse({ kind: "command", ...JSON.parse(doc) })).toEqual(Scanner.trufflehog())
  })

  it("packages/worker/README.md: the embedded runner and device run against a server and report findings", async () => {
    expect(runner).toContain("// my-runner.ts")
    expect(device).toContain('server: "http://127.0.0.1:8080"')
    const fleet = await Fleet.start({ scanSeconds: 20 })
    try {
      await fleet.seed(["acme/leak-1"])
      const p = execa(process.execPath, [`${scratch}device.js`], {
        cwd: scratch,
        reject: false,
        all: true,
        env: { ...process.env, SCANFLEET_TOKEN: fleet.token, SCANFLEET_DOCS_SERVER: fleet.url }
      })
      try {
        const end = Date.now() + 20_000
        let a = await fleet.assignment(1).catch(() => null)
        while ((a === null || a.outcome === null) && Date.now() < end) {
          await new Promise((r) => setTimeout(r, 100))
          a = await fleet.assignment(1).catch(() => null)
        }
        expect(a?.outcome).toBe("findings")
        expect(a?.finalPhase).toBe("staging")
      } finally {
        p.kill("SIGTERM")
      }
      const exit = await p
      expect(exit.exitCode, exit.all).toBe(0)
    } finally {
      await fleet.close()
    }
  })
})
