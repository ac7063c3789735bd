import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import * as Database from "../src/Database.js"
import * as ServerConfig from "../src/ServerConfig.js"

describe("server settings", () => {
  const dir = mkdtempSync(join(tmpdir(), "scanfleet-settings-"))
  afterAll(() => rmSync(dir, { recursive: true, force: true }))

  it("the file is read first, the environment overrides it, explicit overrides win; defaults fill the rest", () => {
    const file = join(dir, "settings.json")
    writeFileSync(file, JSON.stringify({ databaseUrl: "postgres://u:p@db/x", port: 9000, adminToken: "from-the-file-0123456789" }))
    const c = ServerConfig.load({ file, env: { SCANFLEET_PORT: "9100", SCANFLEET_LOG_LEVEL: "warning" }, overrides: { host: "0.0.0.0" } })
    expect(c).toMatchObject({ databaseUrl: "postgres://u:p@db/x", port: 9100, adminToken: "from-the-file-0123456789", logLevel: "warning", host: "0.0.0.0", sweepIntervalMs: 1000 })
    expect(ServerConfig.load({ env: { SCANFLEET_CONFIG: file } }).port).toBe(9000)
  })

  it("SCANFLEET_PG_PREPARE reads on/off (default on); anything else is refused naming pgPrepare", () => {
    const env = { SCANFLEET_ADMIN_TOKEN: "an-admin-token-0123456789" }
    expect(ServerConfig.load({ env }).pgPrepare).toBe(true)
    expect(ServerConfig.load({ env: { ...env, SCANFLEET_PG_PREPARE: "off" } }).pgPrepare).toBe(false)
    expect(ServerConfig.load({ env: { ...env, SCANFLEET_PG_PREPARE: "ON" } }).pgPrepare).toBe(true)
    try {
      ServerConfig.load({ env: { ...env, SCANFLEET_PG_PREPARE: "maybe" } })
      expect.unreachable()
    } catch (e) {
      expect((e as ServerConfig.ServerConfigError).issues.map((i) => i.path)).toEqual([["pgPrepare"]])
    }
  })

  it("an unknown key, a short admin token or a bad port is refused with its path", () => {
    const file = join(dir, "bad.json")
    writeFileSync(file, JSON.stringify({ adminToken: "short", port: 70000, colour: "blue" }))
    try {
      ServerConfig.load({ file })
      expect.unreachable()
    } catch (e) {
      expect(e).toBeInstanceOf(ServerConfig.ServerConfigError)
      expect((e as ServerConfig.ServerConfigError).issues.map((i) => i.path)).toEqual(expect.arrayContaining([["adminToken"], ["port"], []]))
      expect((e as Error).message).toContain("colour")
    }
    expect(() => ServerConfig.load({ file: join(dir, "missing.json") })).toThrow(/cannot read/)
    expect(() => ServerConfig.load({ env: {} })).toThrow(/adminToken/)
  })

  it("an admin token must be sendable as a bearer token: visible ASCII (0x21 to 0x7E), no space; the message names its flag and variable, never the token", () => {
    expect(ServerConfig.make({ adminToken: "!~visible-ASCII_0123456789" }).adminToken).toBe("!~visible-ASCII_0123456789")
    for (const token of ["the same admin token on every instance", "tab\tseparated-admin-token", "line-break-admin-token\n", "ädmin-token-0123456789", "nul\u0000admin-token-0123456789"]) {
      try {
        ServerConfig.make({ adminToken: token })
        expect.unreachable(JSON.stringify(token))
      } catch (e) {
        expect((e as ServerConfig.ServerConfigError).issues.map((i) => i.path)).toEqual([["adminToken"]])
        expect((e as Error).message).toContain("adminToken (--admin-token or SCANFLEET_ADMIN_TOKEN)")
        expect((e as Error).message).not.toContain(token)
      }
    }
  })

  it("docs/server.md's settings table lists every setting, with its variable and flag as the code has them", () => {
    const page = readFileSync(join(__dirname, "../../../docs/server.md"), "utf8")
    const section = page.slice(page.indexOf("## Settings"), page.indexOf("## ", page.indexOf("## Settings") + 3))
    const rows = section
      .split("\n")
      .filter((l) => l.startsWith("| `"))
      .map((l) => l.split(/(?<!\\)\|/).slice(1, 4).map((c) => /^\s*`([^`\s]*)/.exec(c)?.[1] ?? ""))
    const env = (field: string) => Object.entries(ServerConfig.envVars).find(([, f]) => f === field)?.[0] ?? ""
    expect(rows.map(([field]) => field).sort()).toEqual(Object.keys(ServerConfig.ServerConfigSchema.shape).sort())
    for (const [field, variable, flag] of rows) expect({ field, variable, flag }).toEqual({ field, variable: env(field), flag: ServerConfig.flagged.has(field) ? ServerConfig.flagOf(field) : "" })
  })

  it("database URLs: postgres, sqlite paths and memory; passwords are redacted for logs", () => {
    expect(Database.parse("postgres://a:b@h:5432/db")).toEqual({ _tag: "postgres", url: "postgres://a:b@h:5432/db" })
    expect(Database.parse("postgresql://h/db")._tag).toBe("postgres")
    expect(Database.parse("memory:")).toEqual({ _tag: "memory" })
    expect(Database.parse("sqlite:/var/lib/x.db")).toEqual({ _tag: "sqlite", filename: "/var/lib/x.db" })
    expect(Database.parse("/tmp/y.db")).toEqual({ _tag: "sqlite", filename: "/tmp/y.db" })
    expect(Database.redact("postgres://scanfleet:secret@db:5432/x")).toBe("postgres://scanfleet:***@db:5432/x")
  })
})
