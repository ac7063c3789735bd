import { LocalState } from "@scanfleet/worker"
import { execa } from "execa"
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import ts from "typescript"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { bundleEntry } from "./support/Controller.js"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"

/**
 * The Effect embedding of packages/worker/README.md, run as written (only the
 * server address is swapped for the test's): `Supervisor.layer` under
 * `NodeRuntime.runMain`, stopped by SIGTERM.
 */
useNoOrphans()

const pkg = fileURLToPath(new URL("../", import.meta.url))
const repo = fileURLToPath(new URL("../../../", import.meta.url))
const blocks = [...readFileSync(`${repo}packages/worker/README.md`, "utf8").matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1])
const runner = blocks.find((b) => b.startsWith("// my-runner.ts"))!
const program = blocks.find((b) => b.startsWith("// device-effect.ts"))!

// One level under the package, where a bundle finds the unit as the built package does.
const scratch = `${pkg}.test-embed/`
afterAll(() => rmSync(scratch, { recursive: true, force: true }))
beforeAll(async () => {
  mkdirSync(scratch, { recursive: true })
  writeFileSync(`${scratch}my-runner.js`, ts.transpileModule(runner, { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText)
  writeFileSync(`${scratch}device-effect.ts`, program.replace('"http://127.0.0.1:8080"', "process.env.SCANFLEET_DOCS_SERVER!"))
  await bundleEntry(`${scratch}device-effect.ts`, "device-effect", scratch)
}, 120_000)

describe("embedding the worker as an Effect program", () => {
  it("packages/worker/README.md: Supervisor.layer under NodeRuntime.runMain reports findings, and SIGTERM ends it cleanly with its state closed", async () => {
    expect(program).toContain("Supervisor.layer(")
    const fleet = await Fleet.start({ scanSeconds: 40 })
    try {
      await fleet.seed(["acme/leak-7"])
      const p = execa(process.execPath, [`${scratch}device-effect.js`], {
        cwd: scratch,
        reject: false,
        all: true,
        env: { ...process.env, SCANFLEET_TOKEN: fleet.token, SCANFLEET_DOCS_SERVER: fleet.url }
      })
      let found: Awaited<ReturnType<typeof fleet.assignment>> | null = null
      try {
        // A loaded machine starts a bundled program, detects its containment and seals a unit slowly.
        const end = Date.now() + 45_000
        while ((found === null || found.outcome === null) && Date.now() < end) {
          await new Promise((r) => setTimeout(r, 100))
          found = await fleet.assignment(1).catch(() => null)
        }
      } finally {
        p.kill("SIGTERM")
      }
      const exit = await p
      expect(found?.outcome, exit.all).toBe("findings")
      expect(exit.exitCode, exit.all).toBe(0)
      // The scope closed: the lock file is gone and the journal says what the runner logged.
      expect(existsSync(`${scratch}worker.db.lock`)).toBe(false)
      const state = await LocalState.open(`${scratch}worker.db`)
      try {
        const [record] = await state.assignments({ limit: 1 })
        expect(record).toMatchObject({ fleetId: fleet.fleetId, reservationId: 1, status: "done" })
        const r = await state.result(record)
        expect(r?.kind === "result" && r.body.log).toContain("scanning github:acme/leak-7")
      } finally {
        await state.close()
      }
    } finally {
      await fleet.close()
    }
  })
})
