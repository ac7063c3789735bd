import * as FakeSources from "@scanfleet/adapters/testing/FakeSources"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, inject, it, vi } from "vitest"
import * as Catalogue from "../../packages/server-example/src/demo/Catalogue.js"
import * as Demo from "../../packages/server-example/src/demo/Demo.js"

// The other two ways docs/getting-started.md runs the same demo: on PostgreSQL
// (`--database postgres://…`), and against the public APIs listed in a sources
// file with tokens from the environment (here the same file, its base URLs
// pointed at local stand-ins that insist on those tokens).

const root = resolve(__dirname, "../..")
const dirs: Array<string> = []
const dataDir = () => {
  const d = mkdtempSync(join(tmpdir(), "scanfleet-demo-variant-"))
  dirs.push(d)
  return d
}
let admin: pg.Client
const databases: Array<string> = []

beforeAll(async () => {
  admin = new pg.Client({ connectionString: inject("pgUrl") })
  await admin.connect()
  vi.spyOn(console, "log").mockImplementation(() => {})
})

afterAll(async () => {
  vi.restoreAllMocks()
  for (const d of databases) await admin.query(`DROP DATABASE IF EXISTS ${d} WITH (FORCE)`).catch(() => {})
  await admin.end()
  for (const d of dirs) rmSync(d, { recursive: true, force: true })
})

const until = async <A>(what: string, ms: number, probe: () => Promise<A | null | false>): Promise<A> => {
  const end = Date.now() + ms
  for (;;) {
    const v = await probe()
    if (v) return v
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 500))
  }
}

const api = async <A>(demo: Demo.Running, path: string): Promise<A> => {
  const res = await fetch(`${demo.url}${path}`, { headers: { authorization: `Bearer ${demo.adminToken}` } })
  expect(res.status).toBe(200)
  return (await res.json()) as A
}

describe("the demo, pointed elsewhere", () => {
  it("with a postgres:// database URL, the fleet discovers, scans and completes on PostgreSQL", async () => {
    const db = `sf_demo_${Math.random().toString(36).slice(2, 10)}`
    await admin.query(`CREATE DATABASE ${db}`)
    databases.push(db)
    const u = new URL(inject("pgUrl"))
    u.pathname = `/${db}`
    const demo = await Demo.start({ dataDir: dataDir(), port: 0, databaseUrl: u.toString(), log: () => {} })
    try {
      expect(demo.databaseUrl).toMatch(/^postgres:\/\//)
      const s = await until("completed scans", 60_000, async () => {
        const s = await demo.summary()
        return s.targets.queuedNew > 0 && s.assignments.completed > 0 ? s : null
      })
      expect(s.assignments.completed).toBeGreaterThan(0)
      // The rows are in PostgreSQL, not in a SQLite file.
      const check = new pg.Client({ connectionString: u.toString() })
      await check.connect()
      try {
        const n = await check.query("SELECT count(*)::int AS n FROM targets")
        expect(n.rows[0].n).toBeGreaterThan(0)
      } finally {
        await check.end()
      }
    } finally {
      await demo.stop()
    }
  }, 120_000)

  it("a second start reuses the data folder: the same devices and tokens, no second configuration version, the work goes on, and the same targets are pushed again", async () => {
    const dir = dataDir()
    const completedBy = async (demo: Demo.Running, atLeast: number) =>
      until(`${atLeast} completed assignments`, 60_000, async () => {
        const { assignments } = await api<{ assignments: Array<{ deviceId: number }> }>(demo, "/v1/admin/assignments?state=completed&limit=1000")
        return assignments.length >= atLeast ? assignments : null
      })
    // The catalogue's log lines of each run; a scripted push commits to the target's repository (Catalogue.commits).
    const logged: Array<Array<{ message: string; source?: string; identity?: string }>> = [[], []]
    const logTo = (run: number) => (line: string) => void logged[run].push(JSON.parse(line))
    const pushedWithCommit = (run: number) => logged[run].filter((l) => l.message === "catalogue_pushed_again" && `${l.source}:${l.identity}` in Catalogue.commits)
    const first = await Demo.start({ dataDir: dir, port: 0, log: logTo(0) })
    let before: Array<{ deviceId: number }>
    let pushed: { source?: string; identity?: string }
    try {
      expect(first.run).toBe(1)
      before = await completedBy(first, 1)
      pushed = await until("a scripted push with its commit", 60_000, async () => pushedWithCommit(0)[0])
    } finally {
      await first.stop()
    }
    const second = await Demo.start({ dataDir: dir, port: 0, log: logTo(1) })
    try {
      expect(second.run).toBe(2)
      expect(second.adminToken).toBe(first.adminToken)
      const config = await api<{ version: number | null }>(second, "/v1/admin/config")
      expect(config.version).toBe(1)
      // The change is already in the repository: the push is committed again all the same (it once failed "nothing to commit").
      await until(`${pushed.source}:${pushed.identity} pushed again, or a catalogue error`, 60_000, async () =>
        logged[1].some((l) => l.message === "catalogue_error") || pushedWithCommit(1).some((l) => l.source === pushed.source && l.identity === pushed.identity)
      )
      expect(logged[1].filter((l) => l.message === "catalogue_error")).toEqual([])
      // Every assignment, old and new, was claimed by one of the two devices of the first run.
      const after = await completedBy(second, before.length + 1)
      const devices = new Set(after.map((a) => a.deviceId))
      expect(devices.size).toBeLessThanOrEqual(2)
      for (const d of devices) expect([...new Set(before.map((a) => a.deviceId)), 1, 2]).toContain(d)
    } finally {
      await second.stop()
    }
  }, 180_000)

  it("with the sources file of docs/examples/public-sources.json and tokens from the environment, every listed source is discovered", async () => {
    const settings = Demo.PublicSourcesSchema.parse(JSON.parse(readFileSync(join(root, "docs/examples/public-sources.json"), "utf8")))
    const fakes = await FakeSources.start()
    try {
      fakes.github.requiredToken = "github-token"
      fakes.gitlab.requiredToken = "gitlab-token"
      fakes.huggingface.requiredToken = "hf-token"
      fakes.dockerhub.credentials = { identifier: "me", secret: "dockerhub-token" }
      const now = Date.now()
      fakes.github.put("nodejs/node", now - 60_000)
      fakes.gitlab.put("sec/scanner", now - 60_000)
      fakes.huggingface.put("spaces", "huggingface/demo", now - 60_000)
      fakes.dockerhub.tag("library/node", "22", `sha256:${"a".repeat(64)}`)
      const pointed: Demo.PublicSources = {
        ...settings,
        intervalMinutes: 0.05,
        github: { ...settings.github!, baseUrl: fakes.github.url },
        gitlab: { ...settings.gitlab, baseUrl: fakes.gitlab.url },
        huggingface: { ...settings.huggingface, baseUrl: fakes.huggingface.url },
        dockerhub: { ...settings.dockerhub!, baseUrl: fakes.dockerhub.url }
      }
      const env = { GITHUB_TOKEN: "github-token", GITLAB_TOKEN: "gitlab-token", HF_TOKEN: "hf-token", DOCKERHUB_USERNAME: "me", DOCKERHUB_TOKEN: "dockerhub-token" }
      const demo = await Demo.start({ dataDir: dataDir(), port: 0, sources: { kind: "public", settings: pointed, env }, log: () => {} })
      try {
        expect(demo.fakes).toBeNull()
        const cycles = await until("one clean cycle per source", 60_000, async () => {
          const { cycles } = await api<{ cycles: Array<{ source: string; results: number; error: string | null }> }>(demo, "/v1/admin/cycles?limit=100")
          const ok = ["github", "gitlab", "huggingface", "dockerhub"].map((s) => cycles.find((c) => c.source === s && c.results > 0 && c.error === null))
          return ok.every(Boolean) ? cycles : null
        })
        expect(cycles.filter((c) => c.error !== null)).toEqual([])
        // A day's cooldown against the public APIs, not the demo's seconds.
        const config = await api<{ document: { sources: { github: { cooldownSeconds: number } } } }>(demo, "/v1/admin/config")
        expect(config.document.sources.github.cooldownSeconds).toBe(86_400)
      } finally {
        await demo.stop()
      }
    } finally {
      await fakes.close()
    }
  }, 120_000)
})
