import * as FakeSources from "@scanfleet/adapters/testing/FakeSources"
import { Config } from "@scanfleet/core"
import { writeFileSync } from "node:fs"
import { request } from "node:http"
import { createServer } from "node:net"
import { dirname, join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as ServerConfig from "../src/ServerConfig.js"
import { sqliteFile } from "./fixtures/Databases.js"
import { prepare, runCli, serve, spawnCli, type ServerProcess } from "./fixtures/ServerProcess.js"

const adminToken = "cli-admin-token-0123456789abcdef"

// The commands docs/server.md shows (migrate, device add, config preview/apply, serve), run for real.

describe("scanfleet-server CLI (real child processes, SQLite file)", { timeout: 180_000 }, () => {
  beforeAll(prepare)
  const db = sqliteFile()
  const env = { SCANFLEET_DATABASE_URL: db.url, SCANFLEET_ADMIN_TOKEN: adminToken }
  const servers: Array<ServerProcess> = []
  afterAll(async () => {
    for (const s of servers) await s.stop("SIGKILL")
    db.cleanup()
  })
  let deviceToken = ""

  it("a settings error names only the flags serve takes: each flagged setting is in serve --help with its variable, no other setting's flag is, and a bad findings raw key names its variable alone", async () => {
    const help = await runCli(["serve", "--help"])
    expect(help.code, help.stderr).toBe(0)
    // One section a flag: its usage line, then its descriptions. @effect/cli's own flags (--log-level among them) name no variable.
    const sections = help.stdout.split(/\n(?=--)/)
    for (const [env, field] of Object.entries(ServerConfig.envVars)) {
      const flag = ServerConfig.flagOf(field)
      if (ServerConfig.flagged.has(field)) expect(sections.some((s) => new RegExp(`^${flag}\\b`).test(s) && s.includes(`(env ${env})`)), `${field}: ${flag} described with ${env}`).toBe(true)
      else expect(new RegExp(`${flag}\\b`).test(help.stdout), `${field}: no ${flag}`).toBe(false)
    }
    // serve's own --log-level is listed once, without @effect/cli's section for its flag of the same name; a command without its own keeps that one
    expect(sections.filter((s) => /^--log-level\b/.test(s)).map((s) => s.includes("(env SCANFLEET_LOG_LEVEL)"))).toEqual([true])
    const deviceHelp = await runCli(["device", "--help"])
    expect(deviceHelp.stdout.split(/\n(?=--)/).filter((s) => /^--log-level\b/.test(s)).map((s) => s.includes("Sets the minimum log level"))).toEqual([true])
    const bad = await runCli(["serve"], { ...env, SCANFLEET_FINDINGS_RAW_KEY: "short" })
    expect(bad.code).not.toBe(0)
    expect(bad.stderr).toContain("findingsRawKey (SCANFLEET_FINDINGS_RAW_KEY)")
    expect(bad.stderr).not.toContain("--findings-raw-key")
  })

  it("an admin token that cannot be sent as a bearer token (a space, a tab, a non-ASCII character) is refused at start with exit 2, naming its flag and variable, never echoing it", async () => {
    // A server that starts anyway is stopped after 20 s rather than waited for.
    const start = (args: ReadonlyArray<string>, e: Record<string, string>) =>
      new Promise<{ code: number | null; output: string }>((resolve) => {
        const child = spawnCli(args, e)
        let output = ""
        child.stdout!.on("data", (d) => (output += d))
        child.stderr!.on("data", (d) => (output += d))
        const timer = setTimeout(() => child.kill("SIGKILL"), 20_000)
        child.on("close", (code) => (clearTimeout(timer), resolve({ code, output })))
      })
    const spaced = "the same admin token on every instance"
    const fromEnv = await start(["serve", "--port", "0"], { ...env, SCANFLEET_ADMIN_TOKEN: spaced })
    expect(fromEnv.code, fromEnv.output).toBe(2)
    expect(fromEnv.output).toContain("adminToken (--admin-token or SCANFLEET_ADMIN_TOKEN)")
    expect(fromEnv.output).toContain("without spaces")
    expect(fromEnv.output).not.toContain(spaced)
    for (const token of ["tab\tseparated-admin-token", "ädmin-token-0123456789"]) {
      const fromFlag = await start(["serve", "--port", "0", "--admin-token", token], env)
      expect(fromFlag.code, fromFlag.output).toBe(2)
      expect(fromFlag.output).toContain("--admin-token or SCANFLEET_ADMIN_TOKEN")
      expect(fromFlag.output).not.toContain(token)
    }
  })

  it("serve --log-level warning works as docs/server.md shows it, alone or among other flags, over SCANFLEET_LOG_LEVEL: no info or debug line, and the server serves", async () => {
    const freePort = () =>
      new Promise<number>((resolve, reject) => {
        const srv = createServer()
        srv.on("error", reject)
        srv.listen(0, "127.0.0.1", () => {
          const port = (srv.address() as { port: number }).port
          srv.close(() => resolve(port))
        })
      })
    // Nothing at info is written, so "server listening" never comes: wait for /healthz instead.
    const quiet = async (args: ReadonlyArray<string>, port: number) => {
      const child = spawnCli(args, { ...env, SCANFLEET_PORT: String(port), SCANFLEET_LOG_LEVEL: "debug" })
      let out = ""
      child.stdout!.on("data", (d) => (out += d))
      child.stderr!.on("data", (d) => (out += d))
      const exited = new Promise<number | null>((r) => child.on("close", (code) => r(code)))
      let gone: number | null | undefined
      void exited.then((code) => (gone = code))
      try {
        let healthy = false
        for (let i = 0; i < 300 && !healthy && gone === undefined; i++) {
          await new Promise((r) => setTimeout(r, 100))
          healthy = await fetch(`http://127.0.0.1:${port}/healthz`).then((r) => r.ok, () => false)
        }
        expect(gone, `${args.join(" ")} exited:\n${out}`).toBeUndefined()
        expect(healthy, out).toBe(true)
        expect((await fetch(`http://127.0.0.1:${port}/v1/admin/config`, { headers: { authorization: `Bearer ${adminToken}` } })).status).toBe(200)
        child.kill("SIGTERM")
        expect(await exited, out).toBe(0)
      } finally {
        if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
      }
      expect(out, args.join(" ")).not.toMatch(/"level":"(info|debug)"/)
    }
    await quiet(["serve", "--log-level", "warning"], await freePort())
    await quiet(["serve", "--host", "127.0.0.1", "--log-level", "warning"], await freePort())
  })

  it("migrate, device add (token printed once), config preview and apply", async () => {
    const m = await runCli(["migrate"], { SCANFLEET_DATABASE_URL: db.url })
    expect(m.code, m.stderr).toBe(0)
    expect(m.stdout).toContain("schema up to date")

    const d = await runCli(["device", "add", "--name", "scanner-1", "--slots", "2"], { SCANFLEET_DATABASE_URL: db.url })
    expect(d.code, d.stderr).toBe(0)
    deviceToken = d.stdout.trim()
    expect(deviceToken).toMatch(/^sfd_[A-Za-z0-9_-]{43}$/)
    expect(d.stderr).toContain("shown once")

    const dir = dirname(db.url.replace(/^sqlite:/, ""))
    const bad = join(dir, "bad.json")
    writeFileSync(bad, JSON.stringify({ ...Config.defaults, assignments: { ...Config.defaults.assignments, overrides: { dockerhub: { ttlSeconds: 60 } } } }))
    const p = await runCli(["config", "preview", bad], env)
    expect(p.code).toBe(1)
    expect(p.stderr).toContain("assignments.overrides.dockerhub.ttlSeconds")
    const good = join(dir, "good.json")
    writeFileSync(good, JSON.stringify({ ...Config.defaults, assignments: { ...Config.defaults.assignments, overrides: { dockerhub: { ttlSeconds: 7200 } } } }))
    const applied = await runCli(["config", "apply", good, "--by", "ci-test"], env)
    expect(applied.code, applied.stderr).toBe(0)
    expect(applied.stdout).toContain("applied as version 1 by ci-test")

    // findings read the same database: an empty export is a valid SARIF log, a mistyped verb is refused with a suggestion.
    const sarif = await runCli(["findings", "export", "--format", "sarif"], env)
    expect(sarif.code, sarif.stderr).toBe(0)
    expect(JSON.parse(sarif.stdout)).toMatchObject({ version: "2.1.0", runs: [{ results: [] }] })
    const list = await runCli(["findings", "list", "--status", "open"], env)
    expect(list.code, list.stderr).toBe(0)
    expect(list.stdout).toBe("")
    const badStatus = await runCli(["findings", "list", "--status", "closed"], env)
    expect(badStatus.code).toBe(2)
    expect(badStatus.stderr).toContain("--status")
    const typo = await runCli(["findings", "lst"], env)
    expect(typo.code).toBe(2)
    expect(typo.stderr).toContain("list")
    const none = await runCli(["findings", "target", "github", "nobody/nothing"], env)
    expect(none.code).toBe(1)
    expect(none.stderr).toContain("no findings and no related scan")

    const usage = await runCli(["frobnicate"], env)
    expect(usage.code).toBe(2)
    expect(usage.stderr).toContain("unknown command")
  })

  it("serve uses what the CLI stored; SIGTERM stops accepting, finishes the request in flight, and exits 0; tokens never reach the logs, and each line is logged once", async () => {
    const s = await serve([], { ...env, SCANFLEET_LOG_LEVEL: "debug" }, 150_000)
    servers.push(s)
    const cfg = await (await fetch(`${s.url}/v1/admin/config`, { headers: { authorization: `Bearer ${adminToken}` } })).json()
    expect(cfg).toMatchObject({ version: 1, appliedBy: "ci-test", origin: "applied" })
    const claim = await fetch(`${s.url}/v1/assignments/claim`, { method: "POST", headers: { authorization: `Bearer ${deviceToken}` }, body: JSON.stringify({ slot: 0 }) })
    expect(claim.status).toBe(200)
    expect(await claim.json()).toEqual({ assignment: null })
    expect((await fetch(`${s.url}/?token=${adminToken}`, { redirect: "manual" })).status).toBe(303)

    // A request whose body is still arriving when the signal comes.
    const body = JSON.stringify(Config.defaults)
    const port = Number(new URL(s.url).port)
    const inFlight = new Promise<{ status: number; text: string }>((resolve, reject) => {
      const req = request(
        { host: "127.0.0.1", port, method: "POST", path: "/v1/admin/config/preview", headers: { authorization: `Bearer ${adminToken}`, "content-length": Buffer.byteLength(body) } },
        (res) => {
          let text = ""
          res.on("data", (c) => (text += c))
          res.on("end", () => resolve({ status: res.statusCode ?? 0, text }))
        }
      )
      req.on("error", reject)
      req.write(body.slice(0, 40))
      setTimeout(() => {
        s.child.kill("SIGTERM")
        setTimeout(() => req.end(body.slice(40)), 500)
      }, 200)
    })
    const r = await inFlight
    expect(r.status).toBe(200)
    expect(JSON.parse(r.text).valid).toBe(true)
    // The listener is closed: a new connection is refused.
    await expect(fetch(`${s.url}/healthz`)).rejects.toThrow()
    expect(await s.exited).toBe(0)
    const log = s.output()
    expect(log).toContain('"message":"server stopped"')
    // Written once, on stdout: the command line's writer and the server's are one (LogLine.toConsole).
    for (const message of ["server listening", "server stopped"]) expect(log.split("\n").filter((l) => l.includes(`"message":"${message}"`)), message).toHaveLength(1)
    expect(log).toContain('"message":"http"')
    expect(log).not.toContain(deviceToken)
    expect(log).not.toContain(adminToken)
    for (const line of log.split("\n").filter((l) => l.trim() !== "")) expect(() => JSON.parse(line), line).not.toThrow()
  })

  it("a request whose headers are read only after SIGTERM is answered 503 shutting_down, and the server still exits 0", async () => {
    const s = await serve([], env, 150_000)
    servers.push(s)
    const port = Number(new URL(s.url).port)
    const body = JSON.stringify(Config.defaults)
    // Stopped, the server reads nothing: the signal and the request's headers wait together, and
    // it handles the signal first (its request handler detached), then reads the headers.
    s.child.kill("SIGSTOP")
    const answer = new Promise<{ status: number; headers: Record<string, unknown>; text: string }>((resolve, reject) => {
      const req = request(
        { host: "127.0.0.1", port, method: "POST", path: "/v1/admin/config/preview", headers: { authorization: `Bearer ${adminToken}`, "content-length": Buffer.byteLength(body) } },
        (res) => {
          let text = ""
          res.on("data", (c) => (text += c))
          res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text }))
        }
      )
      req.on("error", reject)
      req.write(body.slice(0, 40))
      setTimeout(() => req.end(body.slice(40)), 300)
    })
    await new Promise((r) => setTimeout(r, 100))
    s.child.kill("SIGTERM")
    s.child.kill("SIGCONT")
    // Before, the request reached no handler: no answer, and the listener's close waited for it for ever.
    const within = <A>(p: Promise<A>) => Promise.race([p, new Promise<"no answer in 30 s">((r) => setTimeout(() => r("no answer in 30 s"), 30_000))])
    const r = await within(answer)
    expect(r).toMatchObject({ status: 503, headers: { "retry-after": "1", connection: "close" } })
    expect(JSON.parse((r as { text: string }).text)).toMatchObject({ error: "shutting_down" })
    expect(await within(s.exited)).toBe(0)
    expect(s.output()).toContain('"message":"server stopped"')
  })

  it("serve --sources FILE runs discovery beside the server; a sources file naming no source is refused", async () => {
    const dir = dirname(db.url.replace(/^sqlite:/, ""))
    const empty = join(dir, "no-sources.json")
    writeFileSync(empty, JSON.stringify({ intervalMinutes: 1 }))
    const refused = await runCli(["serve", "--sources", empty], env)
    expect(refused.code).toBe(2)
    expect(refused.stderr).toContain("names no source")

    const fakes = await FakeSources.start()
    try {
      fakes.gitlab.put("group/alpha", Date.now() - 60_000)
      fakes.gitlab.put("group/beta", Date.now() - 120_000)
      const file = join(dir, "sources.json")
      writeFileSync(file, JSON.stringify({ gitlab: { baseUrl: fakes.gitlab.url }, intervalMinutes: 0.05, limits: { maxPages: 2, maxResults: 50 } }))
      const s = await serve(["--sources", file], { ...env, GITLAB_TOKEN: "glpat-secret-value-123" }, 150_000)
      servers.push(s)
      let cycles: Array<{ source: string; queuedNewCount: number }> = []
      for (let i = 0; i < 300 && !cycles.some((c) => c.source === "gitlab"); i++) {
        await new Promise((r) => setTimeout(r, 100))
        cycles = ((await (await fetch(`${s.url}/v1/admin/cycles`, { headers: { authorization: `Bearer ${adminToken}` } })).json()) as { cycles: typeof cycles }).cycles
      }
      const gitlab = cycles.filter((c) => c.source === "gitlab")
      expect(gitlab.length).toBeGreaterThan(0)
      expect(gitlab.reduce((n, c) => n + c.queuedNewCount, 0)).toBe(2)
      s.child.kill("SIGTERM")
      expect(await s.exited).toBe(0)
      expect(s.output()).not.toContain("glpat-secret-value-123")
    } finally {
      await fakes.close()
    }
  })
})
