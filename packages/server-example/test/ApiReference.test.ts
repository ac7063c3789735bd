import { AdminApi, WorkerApi } from "@scanfleet/core"
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "vitest"
import * as ApiReference from "../src/ApiReference.js"
import * as Server from "../src/Server.js"

const docs = fileURLToPath(new URL("../../../docs/api/", import.meta.url))

describe("docs/api", () => {
  it("is generated from the zod schemas and up to date (SCANFLEET_UPDATE_DOCS=1 rewrites it)", () => {
    const pages = ApiReference.render()
    if (process.env.SCANFLEET_UPDATE_DOCS === "1") {
      mkdirSync(docs, { recursive: true })
      for (const [name, text] of Object.entries(pages)) writeFileSync(join(docs, name), text)
    }
    for (const [name, text] of Object.entries(pages)) {
      expect(existsSync(join(docs, name)), `docs/api/${name} is missing`).toBe(true)
      expect(readFileSync(join(docs, name), "utf8"), `docs/api/${name} is stale; run SCANFLEET_UPDATE_DOCS=1 npx vitest run packages/server-example/test/ApiReference.test.ts`).toBe(text)
    }
  })

  it("documents every route the server serves, and only those", () => {
    const documented = [...ApiReference.worker, ...ApiReference.admin, ...ApiReference.operations, ...ApiReference.other].map((e) => `${e.method} ${e.path}`).sort()
    const served = [...Server.router.routes].map((r) => `${r.method === "DELETE" ? "DELETE" : r.method} ${r.path}`).sort()
    expect(documented).toEqual(served)
  })

  it("every documented schema is one exported by core's WorkerApi and AdminApi contracts", () => {
    const contract = new Set<unknown>([...Object.values(WorkerApi), ...Object.values(AdminApi)])
    for (const e of [...ApiReference.worker, ...ApiReference.admin, ...ApiReference.operations]) {
      if (e.body) expect(contract.has(e.body), `${e.method} ${e.path} body`).toBe(true)
      if (e.query && e.path !== "/v1/admin/targets" && e.path !== "/v1/admin/summary") expect(contract.has(e.query), `${e.method} ${e.path} query`).toBe(true)
    }
  })
})
