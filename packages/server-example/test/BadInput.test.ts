import { Operations } from "@scanfleet/core"
import { Effect } from "effect"
import fc from "fast-check"
import { request } from "node:http"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { adminToken, call, start, type Running } from "./fixtures/Harness.js"

// Bodies a careless or hostile client might send: any JSON, near-miss shapes, deep nesting, unicode, raw junk.
const nearMiss = fc.record(
  {
    slot: fc.oneof(fc.integer(), fc.double(), fc.string(), fc.constant(null)),
    fence: fc.oneof(fc.integer(), fc.string()),
    events: fc.array(
      fc.record({ seq: fc.oneof(fc.integer(), fc.string()), kind: fc.string(), phase: fc.constantFrom("assigned", "scanning", "warp", ""), at: fc.oneof(fc.integer(), fc.double()) }, { requiredKeys: [] }),
      { maxLength: 3 }
    ),
    outcome: fc.string(),
    findings: fc.anything({ maxDepth: 2 }),
    [fc.string({ minLength: 1, maxLength: 5 }) as unknown as string]: fc.anything()
  },
  { requiredKeys: [] }
)
const deep = fc.integer({ min: 50, max: 2000 }).map((n) => "[".repeat(n) + "]".repeat(n))
const raw = fc.oneof(
  fc.jsonValue({ maxDepth: 4 }).map((v) => JSON.stringify(v)),
  nearMiss.map((v) => JSON.stringify(v)),
  fc.string({ unit: "grapheme", maxLength: 200 }),
  deep,
  fc.constantFrom("", "{", "null", "[]", '{"slot":1e309}', '{"__proto__":{"slot":0}}', '{"slot":0,"slot":"x"}')
)
const paths = fc.constantFrom(
  "/v1/assignments/claim",
  "/v1/assignments/1/progress",
  "/v1/assignments/1/result",
  "/v1/assignments/1/release",
  "/v1/admin/config/preview",
  "/v1/admin/config/apply",
  "/v1/admin/targets",
  "/v1/admin/targets/requeue",
  "/v1/admin/targets/priority",
  "/v1/admin/assignments/1/cancel",
  "/v1/admin/sources/github/pause",
  "/v1/admin/sources/github/resume",
  "/v1/admin/devices/1/sources"
)

describe("generated bad input", () => {
  let s: Running
  let token = ""
  beforeAll(async () => {
    s = await start()
    token = (await s.addDevice("fuzz", 2)).token
    // One live reservation, so the progress, result and release paths reach their validation.
    await s.run(Effect.suspend(() => s.store.recordObservations([{ source: "github", identity: "a/b", remoteAt: null }], Date.now())))
    const c = await s.device(token, "POST", "/v1/assignments/claim", { slot: 0 })
    expect(c.body.assignment.reservationId).toBe(1)
  })
  afterAll(() => s.close())

  const snapshot = async () => {
    const st = s.store
    const ops = await s.run(Operations.Operations)
    return s.run(
      Effect.all([st.countTargets(), st.listAssignments({ limit: 100 }), st.timeline(1), st.activeConfig(), st.listCycles({ limit: 10 }), ops.sourceControls(), ops.listAudit({ limit: 10 }), ops.deviceFilters()]).pipe(Effect.orDie)
    )
  }

  it("no generated body gets a 5xx; every refusal is a 4xx JSON error with issues or a reason; nothing changes", async () => {
    const before = await snapshot()
    await fc.assert(
      fc.asyncProperty(paths, raw, fc.boolean(), async (path, body, asAdmin) => {
        const r = await call(`${s.url}${path}`, asAdmin ? adminToken : token, "POST", undefined, body)
        // A generated body can happen to be a valid claim of the free slot: with nothing pending it changes nothing.
        if (r.status === 200 && path === "/v1/assignments/claim" && !asAdmin) return expect(r.body).toEqual({ assignment: null })
        expect(r.status, `${path} ${body.slice(0, 200)}`).toBeGreaterThanOrEqual(400)
        expect(r.status, `${path} ${body.slice(0, 200)}`).toBeLessThan(500)
        expect(typeof r.body.error).toBe("string")
        expect(typeof r.body.message).toBe("string")
        if (r.status === 400 || r.status === 422) expect(Array.isArray(r.body.issues)).toBe(true)
        expect(JSON.stringify(r.body)).not.toContain(token)
      }),
      { numRuns: 300 }
    )
    expect(await snapshot()).toEqual(before)
  })

  it("odd request targets and headers never get a 5xx", async () => {
    const port = Number(new URL(s.url).port)
    const raw = (path: string, headers: Record<string, string>) =>
      new Promise<number>((resolve, reject) => {
        const r = request({ host: "127.0.0.1", port, path, method: "GET", headers }, (res) => {
          res.resume()
          resolve(res.statusCode ?? 0)
        })
        r.on("error", reject)
        r.end()
      })
    const targets = ["//", "//x/y", "/%", "/v1/assignments/%ZZ", "/v1/assignments/1%00", "/v1/assignments/99999999999999999999", "/?token=%ZZ", "/v1/admin/assignments?state=%ZZ", "/v1/admin/percentiles?windowHours=1e400", "/v1/admin/percentiles?windowHours=2&windowHours=3", "/v1/admin/cycles?limit=0", "/v1/admin/targets/search?after=%ZZ", "/v1/admin/targets/inspect?source=github&identity=%00", "/v1/admin/audit?before=1e400", "/v1/admin/sources/%ZZ/pause"]
    for (const path of targets)
      for (const headers of [{ authorization: `Bearer ${token}` }, { authorization: `Bearer ${adminToken}`, cookie: "scanfleet_admin=%ZZ; ;=" }, { authorization: "Basic Zm9vOmJhcg==" }] as Array<Record<string, string>>) {
        const status = await raw(path, headers)
        // "//" is the dashboard to the router, so the admin may get a 200; nothing may get a 5xx.
        expect(status, `${path} ${JSON.stringify(headers)}`).toBeGreaterThanOrEqual(200)
        expect(status, `${path} ${JSON.stringify(headers)}`).toBeLessThan(500)
      }
  })
})
