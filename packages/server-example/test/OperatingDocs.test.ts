import { execFile } from "node:child_process"
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { promisify } from "node:util"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { PgStore } from "@scanfleet/adapters"
import { Duration } from "effect"
import * as ServerConfig from "../src/ServerConfig.js"
import { sqliteFile } from "./fixtures/Databases.js"
import { prepare, serve, type ServerProcess } from "./fixtures/ServerProcess.js"

// The day-two tasks of docs/operating.md, run as written against a real server process: each
// shell block of the "Day-two tasks" section runs with bash, `npx scanfleet-server` being this
// checkout's CLI. The first block's placeholder settings (the URL and token of the example)
// are replaced by the test server's; every other line runs unchanged.

const root = fileURLToPath(new URL("../../../", import.meta.url))
const page = "docs/operating.md"
const adminToken = "operating-docs-admin-token-0123456789"
const run = promisify(execFile)
// $USER names who acts; beyond Latin-1, as a header carries it only as UTF-8 bytes.
const operator = "docs-operator Łukasz"

const dayTwoBlocks = (): Array<string> => {
  const text = readFileSync(join(root, page), "utf8")
  const section = text.slice(text.indexOf("## Day-two tasks"))
  return [...section.matchAll(/<!-- covered-by: packages\/server-example\/test\/OperatingDocs\.test\.ts -->\n```sh\n([\s\S]*?)```/g)].map((m) => m[1])
}

describe(`${page}: the day-two tasks run as written`, { timeout: 180_000 }, () => {
  const db = sqliteFile()
  let server: ServerProcess
  let shim: string
  const api = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(server.url + path, { method, headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) })
    return { status: res.status, body: (await res.json()) as any }
  }
  const device = async (token: string, path: string, body: unknown) =>
    (await (await fetch(server.url + path, { method: "POST", headers: { authorization: `Bearer ${token}` }, body: JSON.stringify(body) })).json()) as any

  beforeAll(async () => {
    const bin = await prepare()
    server = await serve([], { SCANFLEET_DATABASE_URL: db.url, SCANFLEET_ADMIN_TOKEN: adminToken }, 120_000)
    shim = mkdtempSync(join(tmpdir(), "scanfleet-npx-"))
    // `npx scanfleet-server ...` runs this checkout's CLI; anything else is refused loudly.
    writeFileSync(
      join(shim, "npx"),
      `#!/usr/bin/env bash\nif [ "$1" != "scanfleet-server" ]; then echo "unexpected npx $1" >&2; exit 97; fi\nshift\nexec "${process.execPath}" "${bin}" "$@"\n`
    )
    chmodSync(join(shim, "npx"), 0o755)
    // The fleet the commands act on: device 1; reservation 1 active on acme/gadgets; acme/widgets
    // and gitlab's grp/a failed; the managed configuration of docs/examples/failure-backoff.json.
    const doc = JSON.parse(readFileSync(join(root, "docs/examples/failure-backoff.json"), "utf8"))
    expect((await api("POST", "/v1/admin/config/apply", doc)).status).toBe(201)
    const d = await api("POST", "/v1/admin/devices", { name: "scanner-1", slots: 2 })
    expect(d.body.device.id).toBe(1)
    const token = d.body.token as string
    await api("POST", "/v1/admin/targets", { targets: [{ source: "github", identity: "acme/gadgets" }], reason: "seed" })
    const a1 = (await device(token, "/v1/assignments/claim", { slot: 0 })).assignment
    expect(a1.reservationId).toBe(1)
    await api("POST", "/v1/admin/targets", { targets: [{ source: "github", identity: "acme/widgets" }, { source: "gitlab", identity: "grp/a" }], reason: "seed" })
    for (let i = 0; i < 2; i++) {
      const a = (await device(token, "/v1/assignments/claim", { slot: 1 })).assignment
      await device(token, `/v1/assignments/${a.reservationId}/result`, { fence: a.fence, outcome: "scan_error", finalPhase: null, findings: [] })
    }
  }, 180_000)
  afterAll(async () => {
    await server?.stop("SIGKILL")
    if (shim) rmSync(shim, { recursive: true, force: true })
    db.cleanup()
  })

  const sh = async (code: string) => {
    const r = await run("bash", ["-euo", "pipefail", "-c", code], {
      cwd: root,
      env: { ...process.env, PATH: `${shim}:${process.env.PATH}`, USER: operator },
      timeout: 60_000
    })
    return r.stdout
  }

  it("the section has its blocks, in order: settings, find, redrive, cancel, priority, pause, drain, instances", () => {
    expect(dayTwoBlocks()).toHaveLength(8)
  })

  it("every block runs, and does what the page says", async () => {
    const [settings, find, redrive, cancel, priority, pause, drain, instances] = dayTwoBlocks()
    const lines = settings.split("\n")
    expect(lines[0]).toMatch(/^export SCANFLEET_SERVER_URL=\S+ SCANFLEET_ADMIN_TOKEN=\S+/)
    const env = `export SCANFLEET_SERVER_URL=${server.url} SCANFLEET_ADMIN_TOKEN=${adminToken}\n`
    expect(JSON.parse(await sh(env + lines.slice(1).join("\n"))).entries.length).toBeGreaterThan(0)

    const found = await sh(env + find)
    expect(found).toContain('"identity": "acme/widgets"')
    expect(found).toContain('"status": "failed"')

    await sh(env + redrive)
    expect((await api("GET", "/v1/admin/targets/inspect?source=github&identity=acme/widgets")).body.target.status).toBe("pending")
    expect((await api("GET", "/v1/admin/targets/inspect?source=gitlab&identity=grp/a")).body.target.status).toBe("pending")

    await sh(env + cancel)
    const gadgets = (await api("GET", "/v1/admin/targets/inspect?source=github&identity=acme/gadgets")).body
    expect(gadgets.assignments[0].cancellation).toMatchObject({ who: operator, why: "stuck in acquiring for an hour" })

    const prioritised = await sh(env + priority)
    expect(prioritised).toContain('"priority": 50')
    expect((await api("GET", "/v1/admin/targets/inspect?source=gitlab&identity=grp/a")).body.target.priority).toBe(50)
    expect((await api("GET", "/v1/admin/targets/inspect?source=github&identity=acme/widgets")).body.target.priority).toBe(-10)

    const paused = await sh(env + pause)
    expect(paused).toContain('"reason": "rate limited until 14:00"')
    expect((await api("GET", "/v1/admin/sources")).body.sources.every((c: any) => !c.paused)).toBe(true)

    await sh(env + drain)
    expect((await api("GET", "/v1/admin/devices")).body.devices[0]).toMatchObject({ id: 1, sources: [], revokedAt: expect.any(Number) })

    const probes = await sh(env + instances)
    expect(probes).toContain('"status":"alive"')
    expect(probes).toContain('"ready":true')

    const audit = (await api("GET", "/v1/admin/audit?limit=50")).body.entries.map((e: any) => [e.action, e.who])
    expect(audit).toEqual(expect.arrayContaining([["requeue", operator], ["cancel", operator], ["set_priority", operator], ["pause_source", operator], ["resume_source", operator], ["revoke_device", operator]]))
  })

  it("docs/examples/probes.yaml probes the two health endpoints the server serves", async () => {
    const yaml = readFileSync(join(root, "docs/examples/probes.yaml"), "utf8")
    expect(yaml).toMatch(/livenessProbe: \{ httpGet: \{ path: \/healthz, port: 8080 \}/)
    expect(yaml).toMatch(/readinessProbe: \{ httpGet: \{ path: \/readyz, port: 8080 \}/)
    // the kill comes after the server's own stop: its grace plus the pool's close
    const kill = Number(/terminationGracePeriodSeconds: (\d+)/.exec(yaml)?.[1])
    expect(kill * 1000).toBeGreaterThan(ServerConfig.make({ adminToken: "x".repeat(32) }).shutdownGraceMs + Duration.toMillis(PgStore.closeWait))
    expect((await fetch(`${server.url}/healthz`)).status).toBe(200)
    expect((await fetch(`${server.url}/readyz`)).status).toBe(200)
  })
})
