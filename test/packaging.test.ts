import { execFile } from "node:child_process"
import { promisify } from "node:util"
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"

const root = resolve(__dirname, "..")
const packages = ["core", "adapters", "worker", "server-example"] as const
const work = mkdtempSync(join(tmpdir(), "scanfleet-pack-"))

// Asynchronous on purpose: a synchronous npm install blocks the test worker's
// event loop for longer than vitest's RPC heartbeat allows, which fails the run.
const execFileAsync = promisify(execFile)
const run = async (cmd: string, args: ReadonlyArray<string>, cwd: string) =>
  (await execFileAsync(cmd, [...args], { cwd, encoding: "utf8", timeout: 240_000, maxBuffer: 16 * 1024 * 1024 })).stdout

describe("packaging", () => {
  beforeAll(async () => {
    for (const p of packages)
      if (!existsSync(join(root, "packages", p, "dist", "index.js")))
        throw new Error(`packages/${p}/dist is missing: npm test builds first (npm run build)`)
    const tarballs: Array<string> = []
    for (const p of packages) {
      const out = await run("npm", ["pack", "--pack-destination", work, "--silent"], join(root, "packages", p))
      tarballs.push(join(work, out.trim().split("\n").pop()!))
    }
    writeFileSync(join(work, "package.json"), JSON.stringify({ name: "consumer", private: true, version: "1.0.0" }))
    // Offline from the npm cache that `npm ci` filled; scripts are not needed to import.
    await run("npm", ["install", "--prefer-offline", "--ignore-scripts", "--no-audit", "--no-fund", ...tarballs], work)
  }, 300_000)

  afterAll(() => rmSync(work, { recursive: true, force: true }))

  for (const p of packages) {
    it(`@scanfleet/${p} declares exports, types, files and engines`, () => {
      const pkg = JSON.parse(readFileSync(join(root, "packages", p, "package.json"), "utf8"))
      expect(pkg.exports["."].import.types).toBe("./dist/index.d.ts")
      expect(pkg.exports["."].require.default).toBe("./dist/index.cjs")
      expect(pkg.types).toBe("./dist/index.d.ts")
      expect(pkg.files).toContain("dist")
      expect(pkg.engines.node).toMatch(/>=20/)
      expect(existsSync(join(root, "packages", p, "README.md"))).toBe(true)
    })

    it(`@scanfleet/${p} imports from ESM and from CommonJS after npm pack`, async () => {
      const esm = await run("node", ["--input-type=module", "-e", `const m = await import("@scanfleet/${p}"); console.log(Object.keys(m).sort().join(","))`], work)
      const cjs = await run("node", ["-e", `const m = require("@scanfleet/${p}"); console.log(Object.keys(m).sort().join(","))`], work)
      expect(esm.trim()).toBe(cjs.trim())
      expect(esm.trim().length).toBeGreaterThan(0)
    })
  }

  it("core's namespaces work the same from both module systems", async () => {
    const code = `const { Promotion, Percentile } = M; console.log(Percentile.cont([10,20,30,40], 0.5), typeof Promotion.decide)`
    const esm = await run("node", ["--input-type=module", "-e", `const M = await import("@scanfleet/core"); ${code}`], work)
    const cjs = await run("node", ["-e", `const M = require("@scanfleet/core"); ${code}`], work)
    expect(esm.trim()).toBe("25 function")
    expect(cjs.trim()).toBe("25 function")
  })
})
