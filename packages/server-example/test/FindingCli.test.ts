import { FindingStore } from "@scanfleet/core"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Database from "../src/Database.js"
import * as FindingCli from "../src/FindingCli.js"
import * as ServerConfig from "../src/ServerConfig.js"
import { sqliteFile } from "./fixtures/Databases.js"
import { scan } from "./fixtures/Scans.js"

const db = sqliteFile()
const config = ServerConfig.make({ adminToken: "cli-findings-token-0123456789", databaseUrl: db.url })
afterAll(() => db.cleanup())

const run = async (...argv: Array<string>) => {
  const words = argv.filter((a, i) => !a.startsWith("--") && !(i > 0 && argv[i - 1].startsWith("--")))
  const flags = new Map<string, string>()
  argv.forEach((a, i) => a.startsWith("--") && flags.set(a.slice(2), argv[i + 1]))
  let out = ""
  let err = ""
  try {
    const code = await FindingCli.main(words, flags, config, (t) => (out += t), (t) => (err += t))
    return { code, out, err }
  } catch (e) {
    return { code: e instanceof FindingCli.FindingsUsageError ? 2 : 1, out, err: String(e) }
  }
}

// The commands docs/findings.md shows (findings list, target, export), run in-process against a SQLite file.
describe("scanfleet-server findings (list, target, export)", () => {
  beforeAll(async () => {
    const t = Date.now()
    await Effect.runPromise(
      Effect.gen(function* () {
        yield* scan("cli/one", ["s1", "s2", "s3"], t)
        yield* scan("cli/one", ["s2", "s3", "s4"], t + 10_000)
        yield* scan("cli/two", ["s5"], t + 20_000)
        // s6 comes and goes with every scan: more changes than a target page carries
        for (let i = 0; i < FindingStore.eventsPerFinding + 5; i++) yield* scan("cli/flaps", i % 2 === 0 ? ["s6", "s7"] : ["s7"], t + 30_000 + i * 10_000)
      }).pipe(Effect.provide(Database.layer(db.url)))
    )
  })

  it("lists with filters and pages by cursor; shows a target's history; exports JSON lines and SARIF", async () => {
    const first = await run("list", "--limit", "2")
    expect(first.code).toBe(0)
    const page1 = first.out.trim().split("\n").map((l) => JSON.parse(l))
    expect(page1).toHaveLength(2)
    const cursor = /--after (\d+)/.exec(first.err)?.[1]
    expect(cursor).toBe(String(page1[1].id))
    const rest = await run("list", "--after", cursor!, "--limit", "10")
    expect(rest.out.trim().split("\n")).toHaveLength(5)
    expect(rest.err).toBe("")
    const resolved = await run("list", "--status", "resolved")
    expect(resolved.out.trim().split("\n").map((l) => JSON.parse(l).path)).toEqual(["s1.txt"])
    expect((await run("list", "--identity", "cli/two", "--status", "new")).out.trim().split("\n")).toHaveLength(1)
    const target = await run("target", "github", "cli/one")
    expect(target.code).toBe(0)
    const t = JSON.parse(target.out)
    expect(t.scans.map((s: { new: number; present: number; resolved: number }) => [s.new, s.present, s.resolved])).toEqual([[3, 0, 0], [1, 2, 1]])
    expect((await run("target", "github", "cli/none")).code).toBe(1)
    const sarif = JSON.parse((await run("export", "--format", "sarif", "--identity", "cli/one")).out)
    expect(sarif.version).toBe("2.1.0")
    expect(sarif.runs[0].results).toHaveLength(4)
    expect((await run("export")).out.trim().split("\n")).toHaveLength(7)
    expect((await run("list", "--status", "gone")).code).toBe(2)
    expect((await run("frobnicate")).code).toBe(2)
  })

  it("prints a target's whole history, the changes a target page leaves off included", async () => {
    const target = await run("target", "github", "cli/flaps")
    expect(target.code, target.err).toBe(0)
    const t = JSON.parse(target.out)
    const [flapping, steady] = t.findings.map((f: { id: number }) => f.id)
    const kinds = (id: number) => t.events.filter((e: { findingId: number }) => e.findingId === id).map((e: { kind: string }) => e.kind)
    const n = FindingStore.eventsPerFinding + 5
    expect(kinds(flapping)).toEqual(Array.from({ length: n }, (_, i) => (i === 0 ? "new" : i % 2 === 1 ? "resolved" : "reopened")))
    expect(kinds(steady)).toEqual(["new"])
    expect(t.scans).toHaveLength(n)
  })
})
