import Sqlite from "better-sqlite3"
import { Store } from "@scanfleet/core"
import { Effect, Layer, ManagedRuntime } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import * as Database from "../src/Database.js"
import { exportLimit } from "../src/FindingRoutes.js"
import * as ServerMod from "../src/Server.js"
import * as ServerConfig from "../src/ServerConfig.js"
import { sqliteFile } from "./fixtures/Databases.js"
import { adminToken } from "./fixtures/Harness.js"

// The export past its limit, on a SQLite file with one more finding than it writes: the answer is
// written a page at a time and says where it was cut, in both formats.

const db = sqliteFile()
afterAll(() => db.cleanup())
const T0 = Date.UTC(2025, 0, 1)
const N = exportLimit + 1

describe("findings export past its limit", () => {
  it(`writes the first ${exportLimit.toLocaleString("en-US")} of ${N.toLocaleString("en-US")} findings in id order and says where it stopped: a JSON lines trailer, a SARIF run property`, async () => {
    const rt = ManagedRuntime.make(
      ServerMod.layer(ServerConfig.make({ adminToken, host: "127.0.0.1", port: 0, logLevel: "none", databaseUrl: db.url })).pipe(Layer.provideMerge(Database.layer(db.url)))
    )
    try {
      const url = (await rt.runPromise(ServerMod.Info)).url
      await rt.runPromise(Effect.flatMap(Store.Store, (s) => s.recordObservations([{ source: "github", identity: "bulk/export", remoteAt: null }], T0)))
      const file = db.url.replace(/^sqlite:/, "")
      const raw = new Sqlite(file)
      try {
        const target = raw.prepare("SELECT id FROM targets WHERE identity = 'bulk/export'").get() as { id: number }
        // Two detectors, alternating, so the SARIF rules and rule indexes are checked too.
        raw.exec(`INSERT INTO findings (target_id, source, identity, detector, path, fingerprint, preview, status, first_seen_at, last_seen_at, details)
          SELECT ${target.id}, 'github', 'bulk/export', CASE n % 2 WHEN 0 THEN 'even' ELSE 'odd' END, 'dir with space/' || n || '.env', 'hmac-sha256:' || n, '…(8)', 'new', ${T0}, ${T0}, '{}'
          FROM (WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ${N}) SELECT n FROM g)`)
      } finally {
        raw.close()
      }
      const get = (format: string) => fetch(`${url}/v1/admin/findings/export?format=${format}`, { headers: { authorization: `Bearer ${adminToken}` } })

      const jsonl = await get("jsonl")
      expect(jsonl.status).toBe(200)
      expect(jsonl.headers.get("content-type")).toContain("application/x-ndjson")
      // Written as it is read: chunked, with no length known up front.
      expect(jsonl.headers.get("content-length")).toBeNull()
      expect(jsonl.headers.get("transfer-encoding")).toBe("chunked")
      const lines = (await jsonl.text()).trimEnd().split("\n")
      expect(lines).toHaveLength(exportLimit + 1)
      expect(JSON.parse(lines.at(-1)!)).toEqual({ truncatedAt: exportLimit })
      const ids = lines.slice(0, -1).map((l) => (JSON.parse(l) as { id: number }).id)
      expect(ids.every((id, i) => i === 0 || id > ids[i - 1])).toBe(true)
      expect(new Set(ids).size).toBe(exportLimit)

      const sarif = await get("sarif")
      expect(sarif.status).toBe(200)
      const log = (await sarif.json()) as {
        version: string
        runs: Array<{ tool: { driver: { rules: Array<{ id: string }> } }; results: Array<{ ruleId: string; ruleIndex: number; properties: { findingId: number } }>; properties?: unknown }>
      }
      expect(log.version).toBe("2.1.0")
      const [run] = log.runs
      expect(run.results).toHaveLength(exportLimit)
      expect(run.properties).toEqual({ truncatedAt: exportLimit })
      expect(run.results.map((r) => r.properties.findingId)).toEqual(ids)
      expect(run.results.every((r) => run.tool.driver.rules[r.ruleIndex].id === r.ruleId)).toBe(true)
      expect(run.tool.driver.rules.map((r) => r.id).sort()).toEqual(["even", "odd"])

      // Under the limit, nothing says it was cut.
      const one = await fetch(`${url}/v1/admin/findings/export?format=sarif&identity=none/such`, { headers: { authorization: `Bearer ${adminToken}` } })
      expect((await one.json()) as unknown).toEqual({
        $schema: "https://json.schemastore.org/sarif-2.1.0.json",
        version: "2.1.0",
        runs: [{ results: [], tool: { driver: { name: "scanfleet", version: "2", informationUri: "https://github.com/scanfleet/scanfleet", rules: [] } } }]
      })
      expect(await (await fetch(`${url}/v1/admin/findings/export?identity=none/such`, { headers: { authorization: `Bearer ${adminToken}` } })).text()).toBe("")
    } finally {
      await rt.dispose()
    }
  }, 120_000)
})
