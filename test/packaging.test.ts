import { execFile } from "node:child_process"
import { builtinModules } from "node:module"
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { promisify } from "node:util"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { entries as standaloneEntries, optionalNative } from "../build/standalone.js"

/**
 * What a stranger gets from the registry: every package is packed, then each
 * one is installed ALONE into an empty project (its sibling @scanfleet
 * packages, which are not on the registry, come from their tarballs through
 * `overrides`; everything else from the npm cache that `npm ci` filled), and
 * imported from ESM and CommonJS and type-checked with `skipLibCheck: false`.
 * The bins are then run as a user runs them: `npx` in that project. This is
 * the install that docs/getting-started.md shows from the registry.
 */

const root = resolve(__dirname, "..")
const packages = ["core", "adapters", "worker", "server-example"] as const
type Pkg = (typeof packages)[number]
const work = mkdtempSync(join(tmpdir(), "scanfleet-pack-"))
const tsc = join(root, "node_modules", ".bin", "tsc")
const typesNode = JSON.parse(readFileSync(join(root, "package.json"), "utf8")).devDependencies["@types/node"] as string

// Asynchronous on purpose: a synchronous npm install blocks the test worker's
// event loop for longer than vitest's RPC heartbeat allows, which fails the run.
const execFileAsync = promisify(execFile)
interface Ran {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}
const exec = async (cmd: string, args: ReadonlyArray<string>, cwd: string, env: Record<string, string> = {}): Promise<Ran> => {
  try {
    const r = await execFileAsync(cmd, [...args], { cwd, encoding: "utf8", timeout: 240_000, maxBuffer: 16 * 1024 * 1024, env: { ...process.env, NO_COLOR: "1", ...env } })
    return { code: 0, stdout: r.stdout, stderr: r.stderr }
  } catch (e) {
    const x = e as { code?: number | string; stdout?: string; stderr?: string }
    if (typeof x.code !== "number") throw e
    return { code: x.code, stdout: x.stdout ?? "", stderr: x.stderr ?? "" }
  }
}
const run = async (cmd: string, args: ReadonlyArray<string>, cwd: string): Promise<string> => {
  const r = await exec(cmd, args, cwd)
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(" ")} exited ${r.code}\n${r.stderr}\n${r.stdout}`)
  return r.stdout
}

const manifest = (p: Pkg) => JSON.parse(readFileSync(join(root, "packages", p, "package.json"), "utf8"))
const tarball: Partial<Record<Pkg, string>> = {}
const consumer = (p: Pkg) => join(work, `consumer-${p}`)

/** The entry points of a package, as a consumer names them (without "/internal/*" and "./package.json"). */
const entries = (p: Pkg): Array<string> =>
  Object.keys(manifest(p).exports)
    .filter((k) => k !== "./package.json" && !k.includes("*"))
    .map((k) => (k === "." ? `@scanfleet/${p}` : `@scanfleet/${p}/${k.slice(2)}`))
/** Entries that load a test runner: checked for types, imported only under vitest. */
const needsTestRunner = (e: string) => e === "@scanfleet/adapters/testing" || e === "@scanfleet/adapters/Conformance"

const install = async (p: Pkg) => {
  const dir = consumer(p)
  mkdirSync(dir)
  const siblings = Object.keys(manifest(p).dependencies ?? {}).filter((d) => d.startsWith("@scanfleet/"))
  // A sibling's own siblings too (server-example → adapters → core).
  const all = new Set<string>()
  const walk = (names: ReadonlyArray<string>) => {
    for (const n of names) {
      if (all.has(n)) continue
      all.add(n)
      walk(Object.keys(manifest(n.slice("@scanfleet/".length) as Pkg).dependencies ?? {}).filter((d) => d.startsWith("@scanfleet/")))
    }
  }
  walk(siblings)
  writeFileSync(
    join(dir, "package.json"),
    JSON.stringify({
      name: `consumer-${p}`,
      private: true,
      version: "1.0.0",
      dependencies: { [`@scanfleet/${p}`]: `file:${tarball[p]}`, "@types/node": typesNode },
      overrides: Object.fromEntries([...all].map((n) => [n, `file:${tarball[n.slice("@scanfleet/".length) as Pkg]}`]))
    })
  )
  // From the npm cache; scripts are not needed to import (better-sqlite3's native build is not exercised here).
  await run("npm", ["install", "--prefer-offline", "--ignore-scripts", "--no-audit", "--no-fund"], dir)
}

describe("packaging", { timeout: 300_000 }, () => {
  beforeAll(async () => {
    for (const p of packages)
      if (!existsSync(join(root, "packages", p, "dist", "index.js")))
        throw new Error(`packages/${p}/dist is missing: npm test builds first (npm run build)`)
    // Each pack writes its own tarball and each install its own directory (npm's cache is safe to
    // share), so they run side by side: the event loop stays free and the wall time is the slowest one.
    await Promise.all(
      packages.map(async (p) => {
        const out = await run("npm", ["pack", "--pack-destination", work, "--silent"], join(root, "packages", p))
        tarball[p] = join(work, out.trim().split("\n").pop()!)
      })
    )
    await Promise.all(packages.map(install))
  }, 600_000)

  // Asynchronous too: four installed dependency trees are tens of thousands of files, and a
  // synchronous removal held this worker's event loop for 17 s on a loaded 2-core machine.
  afterAll(() => rm(work, { recursive: true, force: true }))

  for (const p of packages) {
    it(`@scanfleet/${p} declares exports, types, files, engines, license and where it lives`, () => {
      const pkg = manifest(p)
      expect(pkg.exports["."].import.types).toBe("./dist/index.d.ts")
      expect(pkg.exports["."].require.default).toBe("./dist/index.cjs")
      expect(pkg.types).toBe("./dist/index.d.ts")
      expect(pkg.files).toEqual(expect.arrayContaining(["dist", "LICENSE", "README.md"]))
      expect(pkg.engines.node).toMatch(/>=20/)
      expect(pkg.license).toBe("MIT")
      expect(readFileSync(join(root, "packages", p, "LICENSE"), "utf8")).toBe(readFileSync(join(root, "LICENSE"), "utf8"))
      expect(pkg.repository).toMatchObject({ type: "git", directory: `packages/${p}` })
      expect(pkg.homepage).toMatch(/^https:\/\//)
      expect(pkg.bugs.url).toMatch(/^https:\/\//)
      expect(pkg.keywords.length).toBeGreaterThan(2)
      expect(existsSync(join(root, "packages", p, "README.md"))).toBe(true)
    })

    it(`@scanfleet/${p} takes effect, @effect/* and zod as peers with ranges, and declares every package its build imports`, () => {
      const pkg = manifest(p)
      const deps: Record<string, string> = pkg.dependencies ?? {}
      const peers: Record<string, string> = pkg.peerDependencies ?? {}
      for (const name of Object.keys(deps)) expect(name === "effect" || name === "zod" || name.startsWith("@effect/"), `${name} must be a peer`).toBe(false)
      for (const [name, range] of Object.entries(peers)) expect(range, name).toMatch(/^\^\d/)
      expect(Object.keys(peers)).toContain("effect")
      // Every bare import in the build (ESM and CJS) names a declared dependency, peer or builtin,
      // so nothing works only because a sibling happened to bring it.
      const declared = new Set([...Object.keys(deps), ...Object.keys(peers), `@scanfleet/${p}`])
      const dist = join(root, "packages", p, "dist")
      const imported = new Set<string>()
      const name = (spec: string) => (spec.startsWith("@") ? spec.split("/").slice(0, 2).join("/") : spec.split("/")[0])
      // A standalone entry (build/standalone.ts) holds its dependencies' code, and with it their
      // strings; what it loads at run time are its top-level imports and its bundled `require`s.
      const own: ReadonlyArray<string> = Object.keys((standaloneEntries as Record<string, Record<string, string>>)[p] ?? {}).map((e) => `${e}.js`)
      for (const f of own) {
        const text = readFileSync(join(dist, f), "utf8")
        for (const m of text.matchAll(/^import\b[^"'\n]*["']([^"'./][^"']*)["'];?$|\b__require\(["']([^"'./][^"']*)["']\)/gm)) {
          const spec = m[1] ?? m[2]
          if (spec.startsWith("node:") || builtinModules.includes(spec) || builtinModules.includes(name(spec))) continue
          // loaded by pg and ws only when installed, inside a try
          if (optionalNative.includes(spec)) continue
          imported.add(name(spec))
        }
      }
      for (const f of readdirSync(dist).filter((f) => /\.(c?js|d\.c?ts)$/.test(f) && !own.includes(f))) {
        const text = readFileSync(join(dist, f), "utf8")
        for (const m of text.matchAll(/(?:from\s*|import\s*\(\s*|require\s*\(\s*|import\s+)["']([^"'./][^"']*)["']/g)) {
          const spec = m[1]
          if (spec.startsWith("node:") || builtinModules.includes(name(spec))) continue
          imported.add(name(spec))
        }
      }
      expect([...imported].filter((n) => !declared.has(n) && !(n === "pg" && declared.has("@types/pg"))).sort()).toEqual([])
      expect(imported.size).toBeGreaterThan(0)
    })

    it(`@scanfleet/${p} installed alone imports from ESM and from CommonJS`, async () => {
      const dir = consumer(p)
      for (const e of entries(p).filter((e) => !needsTestRunner(e))) {
        const esm = await run("node", ["--input-type=module", "-e", `const m = await import(${JSON.stringify(e)}); console.log(Object.keys(m).sort().join(","))`], dir)
        const cjs = await run("node", ["-e", `const m = require(${JSON.stringify(e)}); console.log(Object.keys(m).sort().join(","))`], dir)
        expect(esm.trim(), e).toBe(cjs.trim())
        expect(esm.trim().length, e).toBeGreaterThan(0)
      }
    })

    it(`@scanfleet/${p} installed alone type-checks from ESM and CommonJS with skipLibCheck false`, async () => {
      const dir = consumer(p)
      const es = entries(p).filter((e) => !needsTestRunner(e))
      writeFileSync(join(dir, "esm.mts"), es.map((e, i) => `import * as m${i} from ${JSON.stringify(e)}\nexport const k${i}: ReadonlyArray<string> = Object.keys(m${i})\n`).join(""))
      writeFileSync(join(dir, "cjs.cts"), es.map((e, i) => `import * as m${i} from ${JSON.stringify(e)}\nexport const k${i}: ReadonlyArray<string> = Object.keys(m${i})\n`).join(""))
      writeFileSync(
        join(dir, "tsconfig.json"),
        JSON.stringify({
          compilerOptions: { module: "nodenext", moduleResolution: "nodenext", target: "es2022", strict: true, skipLibCheck: false, noEmit: true, types: ["node"] },
          include: ["esm.mts", "cjs.cts"]
        })
      )
      const r = await exec(tsc, ["-p", "."], dir)
      expect(r.stdout + r.stderr).toBe("")
      expect(r.code).toBe(0)
    })

    it(`@scanfleet/${p}: every value its namespaces export at run time is a value in its published types`, async () => {
      // A schema and a type of one name ("export const X" beside "export type X") lose the value in the
      // bundled .d.ts; such a schema needs its second name ("XSchema"), and this finds any that has none.
      const dir = consumer(p)
      const e = entries(p).filter((x) => !needsTestRunner(x))[0]
      const listed = await run(
        "node",
        [
          "--input-type=module",
          "-e",
          `const m = await import(${JSON.stringify(e)}); for (const [k, v] of Object.entries(m)) if (typeof v === "object" && v !== null) for (const s of Object.keys(v)) console.log(k + "." + s)`
        ],
        dir
      )
      const all = listed.trim().split("\n").filter((l) => l.length > 0)
      // The schema of such a pair is checked under its second name.
      const values = all.filter((v) => !all.includes(`${v}Schema`))
      expect(values.length).toBeGreaterThan(10)
      writeFileSync(join(dir, "values.mts"), `import * as m from ${JSON.stringify(e)}\nexport const values: ReadonlyArray<unknown> = [\n${values.map((v) => `  m.${v},`).join("\n")}\n]\n`)
      writeFileSync(
        join(dir, "tsconfig.values.json"),
        JSON.stringify({ compilerOptions: { module: "nodenext", moduleResolution: "nodenext", target: "es2022", strict: true, noEmit: true, types: ["node"] }, include: ["values.mts"] })
      )
      const r = await exec(tsc, ["-p", "tsconfig.values.json"], dir)
      expect(r.stdout + r.stderr).toBe("")
      expect(r.code).toBe(0)
    })
  }

  it("nothing test-only reaches a root export: the adapters' root loads without vitest installed", async () => {
    expect(existsSync(join(consumer("adapters"), "node_modules", "vitest"))).toBe(false)
    const keys = await run("node", ["--input-type=module", "-e", `const m = await import("@scanfleet/adapters"); console.log(Object.keys(m).join(","))`], consumer("adapters"))
    expect(keys.split(",")).not.toContain("FakeSources")
    expect(keys.split(",")).not.toContain("Conformance")
    const pkg = manifest("adapters")
    expect(pkg.peerDependenciesMeta).toEqual({ vitest: { optional: true }, "@effect/vitest": { optional: true } })
  })

  describe("the bins, run with npx from an installed tarball", () => {
    // `npx` for the version and help (what a user types); the bin npm linked for the rest, which is
    // what npx runs, without starting npm each time on a busy machine.
    const server = (args: ReadonlyArray<string>, env: Record<string, string> = {}, npx = false) =>
      npx
        ? exec("npx", ["--no-install", "scanfleet-server", ...args], consumer("server-example"), { SCANFLEET_ADMIN_TOKEN: "", ...env })
        : exec(join(consumer("server-example"), "node_modules", ".bin", "scanfleet-server"), args, consumer("server-example"), { SCANFLEET_ADMIN_TOKEN: "", ...env })
    const worker = (args: ReadonlyArray<string>, npx = false) =>
      npx
        ? exec("npx", ["--no-install", "scanfleet-worker", ...args], consumer("worker"))
        : exec(join(consumer("worker"), "node_modules", ".bin", "scanfleet-worker"), args, consumer("worker"))
    const version = (p: Pkg) => manifest(p).version as string

    it("--version prints the package version on stdout and exits 0", async () => {
      for (const [r, p] of [[await server(["--version"], {}, true), "server-example"], [await worker(["--version"], true), "worker"]] as const) {
        expect(r.code, r.stderr).toBe(0)
        expect(r.stdout.trim()).toBe(version(p))
        expect(r.stderr).toBe("")
      }
    })

    it("--help and -h print the usage on stdout and exit 0; the help names each setting's environment variable", async () => {
      for (const flag of ["--help", "-h"]) {
        const r = await server([flag], {}, flag === "--help")
        expect(r.code, r.stderr).toBe(0)
        expect(r.stdout).toContain("serve")
        expect(r.stdout).toContain("device add")
        expect(r.stdout).not.toMatch(/\x1b\[/)
        const w = await worker([flag])
        expect(w.code, w.stderr).toBe(0)
        expect(w.stdout).toContain("status")
      }
      const serve = await server(["serve", "--help"])
      expect(serve.code).toBe(0)
      for (const env of ["SCANFLEET_ADMIN_TOKEN", "SCANFLEET_DATABASE_URL", "SCANFLEET_PORT", "SCANFLEET_HOST", "SCANFLEET_LOG_FORMAT", "SCANFLEET_CONFIG"]) expect(serve.stdout).toContain(env)
      const run = await worker(["run", "--help"])
      for (const env of ["SCANFLEET_SERVER", "SCANFLEET_TOKEN", "SCANFLEET_SCANNER", "SCANFLEET_STATE"]) expect(run.stdout).toContain(env)
    })

    it("serve --prot 9091 is refused with exit 2 and a suggestion, and nothing listens", async () => {
      const r = await server(["serve", "--prot", "9091"], { SCANFLEET_ADMIN_TOKEN: "0123456789abcdef0123" })
      expect(r.code).toBe(2)
      expect(r.stdout).toBe("")
      expect(r.stderr).toContain("unknown option '--prot'")
      expect(r.stderr).toContain("did you mean '--port'?")
    })

    it("a mistyped subcommand is refused with exit 2 and a suggestion", async () => {
      const r = await server(["serv"])
      expect(r.code).toBe(2)
      expect(r.stderr).toContain("did you mean 'serve'?")
      const d = await server(["device", "ad", "--name", "x"])
      expect(d.code).toBe(2)
      expect(d.stderr).toContain("did you mean 'add'?")
      const w = await worker(["stauts"])
      expect(w.code).toBe(2)
      expect(w.stderr).toContain("did you mean 'status'?")
    })

    it("--database mysql://x is refused by scheme, and no file is created", async () => {
      const dir = consumer("server-example")
      const before = readdirSync(dir).sort()
      const r = await server(["serve", "--database", "mysql://x"], { SCANFLEET_ADMIN_TOKEN: "0123456789abcdef0123" })
      expect(r.code).toBe(2)
      expect(r.stderr).toContain('unsupported database URL scheme "mysql:"')
      expect(r.stderr).toContain("--database or SCANFLEET_DATABASE_URL")
      const env = await server(["migrate"], { SCANFLEET_DATABASE_URL: "mysql://x" })
      expect(env.code).toBe(2)
      expect(env.stderr).toContain("mysql:")
      expect(readdirSync(dir).sort()).toEqual(before)
    })

    it("serve without an admin token names --admin-token and SCANFLEET_ADMIN_TOKEN", async () => {
      const r = await server(["serve"])
      expect(r.code).toBe(2)
      expect(r.stderr).toContain("adminToken (--admin-token or SCANFLEET_ADMIN_TOKEN): required")
      const short = await server(["serve"], { SCANFLEET_ADMIN_TOKEN: "short" })
      expect(short.code).toBe(2)
      expect(short.stderr).toContain("at least 16 characters")
    })

    it("scanfleet-worker status --state missing.db refuses a missing state file and does not create it", async () => {
      const dir = consumer("worker")
      const r = await worker(["status", "--state", "missing.db"])
      expect(r.code).toBe(1)
      expect(r.stdout).toBe("")
      expect(r.stderr).toContain("no state file at missing.db")
      expect(existsSync(join(dir, "missing.db"))).toBe(false)
      const h = await worker(["history", "--state", "missing.db"])
      expect(h.code).toBe(1)
      expect(existsSync(join(dir, "missing.db"))).toBe(false)
    })

    it("scanfleet-worker run without a server names --server and SCANFLEET_SERVER", async () => {
      const r = await worker(["run", "--token", "t", "--scanner", "demo"])
      expect(r.code).toBe(2)
      expect(r.stderr).toContain("missing --server URL (or set SCANFLEET_SERVER)")
    })
  })

  it("core's namespaces work the same from both module systems", async () => {
    const code = `const { Promotion, Percentile } = M; console.log(Percentile.cont([10,20,30,40], 0.5), typeof Promotion.decide)`
    const esm = await run("node", ["--input-type=module", "-e", `const M = await import("@scanfleet/core"); ${code}`], consumer("core"))
    const cjs = await run("node", ["-e", `const M = require("@scanfleet/core"); ${code}`], consumer("core"))
    expect(esm.trim()).toBe("25 function")
    expect(cjs.trim()).toBe("25 function")
  })

  it("npm publish --dry-run is clean for every package (no warning but the missing login)", async () => {
    for (const p of packages) {
      const r = await exec("npm", ["publish", "--dry-run"], join(root, "packages", p))
      expect(r.code, r.stderr).toBe(0)
      const warnings = (r.stdout + r.stderr).split("\n").filter((l) => /npm (warn|error|ERR)/i.test(l) && !/requires you to be logged in/.test(l))
      expect(warnings, p).toEqual([])
      expect(r.stdout + r.stderr).toContain(`@scanfleet/${p}@${manifest(p).version}`)
    }
  })
})
