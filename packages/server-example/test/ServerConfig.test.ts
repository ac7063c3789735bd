import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
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

  it("database URLs: postgres, sqlite paths and memory; passwords are redacted for logs", () => {
    expect(Database.parse("postgres://a:b@h:5432/db")).toEqual({ _tag: "postgres", url: "postgres://a:b@h:5432/db" })
    expect(Database.parse("postgresql://h/db")._tag).toBe("postgres")
    expect(Database.parse("memory:")).toEqual({ _tag: "memory" })
    expect(Database.parse("sqlite:/var/lib/x.db")).toEqual({ _tag: "sqlite", filename: "/var/lib/x.db" })
    expect(Database.parse("/tmp/y.db")).toEqual({ _tag: "sqlite", filename: "/tmp/y.db" })
    expect(Database.redact("postgres://scanfleet:secret@db:5432/x")).toBe("postgres://scanfleet:***@db:5432/x")
  })
})
