import { Config, WorkerApi } from "@scanfleet/core"
import { Either } from "effect"
import fc from "fast-check"
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest"
import { addDevice, storeOn } from "./support/Fleet.js"
import { adminToken, type Answer, call, database, marked, type ServerProc, snapshot, startServer } from "./support/Procs.js"

/**
 * Generated bad input against a real server process on PostgreSQL: for every
 * endpoint that reads a body, query or path parameter, fast-check makes
 * malformed, oversized, deeply nested, wrong-typed and unicode-heavy input.
 * Each is refused with a 4xx whose body names the field at fault; nothing is
 * ever a 5xx, and the database is unchanged after every property.
 */

let db: Awaited<ReturnType<typeof database>>
let server: ServerProc
let store: ReturnType<typeof storeOn>
let device: { id: number; token: string }
let live: { reservationId: number; fence: number }

beforeAll(async () => {
  db = await database(inject("pgUrl"))
  server = await startServer({ databaseUrl: db.url, logLevel: "warning" })
  store = storeOn(db.url)
  await store.seed(Array.from({ length: 6 }, (_, i) => `bad-input/repo-${i}`))
  device = await addDevice(server.url, "fuzzed", 4)
  const c = await call(server.url, "POST", "/v1/assignments/claim", { token: device.token, body: { slot: 0 } })
  live = c.body.assignment
}, 240_000)

afterAll(async () => {
  await store?.close()
  await server?.kill("SIGTERM")
  await db?.drop()
  expect(marked()).toEqual([])
})

const runs = Number(process.env.SCANFLEET_FUZZ_RUNS ?? 60)

/** The refusal contract: a 4xx, an error code, and at least one issue with a field path. */
const expectRefusal = (r: Answer, what: string) => {
  expect(r.status, `${what} answered ${r.status}: ${r.text.slice(0, 300)}`).toBeGreaterThanOrEqual(400)
  expect(r.status, `${what} answered ${r.status}: ${r.text.slice(0, 300)}`).toBeLessThan(500)
  const body = WorkerApi.ErrorBody.safeParse(r.body)
  expect(body.success, `${what}: the error body is not the contract's: ${r.text.slice(0, 300)}`).toBe(true)
  expect(body.data!.issues?.length ?? 0, `${what}: no field path in ${r.text.slice(0, 300)}`).toBeGreaterThan(0)
  for (const i of body.data!.issues!) expect(Array.isArray(i.path)).toBe(true)
}

const unicode = fc.string({ unit: "binary", maxLength: 40 })
/** JSON values of every kind, unicode keys and strings included. */
const anyJson = fc.oneof(fc.unicodeJsonValue({ maxDepth: 4 }), fc.jsonValue({ maxDepth: 3 }))
/** A value that is not of JSON type `t`. */
const otherThan = (t: "number" | "string" | "array" | "object" | "boolean") =>
  anyJson.filter((v) => (t === "array" ? !Array.isArray(v) : t === "object" ? typeof v !== "object" || v === null || Array.isArray(v) : typeof v !== t))

/** Deeply nested JSON text: arrays or objects `depth` levels down. */
const nested = fc.tuple(fc.integer({ min: 50, max: 20_000 }), fc.boolean()).map(([depth, obj]) => (obj ? '{"a":'.repeat(depth) + "1" + "}".repeat(depth) : "[".repeat(depth) + "]".repeat(depth)))

/** Bodies a schema refuses: random JSON, wrong-typed fields, unknown fields, deep nesting, broken text. */
const badBodies = (valid: () => Record<string, unknown>, schema: { safeParse: (v: unknown) => { success: boolean } }) => {
  const wrongField = fc.constantFrom(...Object.keys(valid())).chain((k) => otherThan(typeof valid()[k] === "number" ? "number" : Array.isArray(valid()[k]) ? "array" : "string").map((v) => ({ ...valid(), [k]: v })))
  const extraField = fc.tuple(unicode.filter((k) => !(k in valid())), anyJson).map(([k, v]) => ({ ...valid(), [k]: v }))
  const json = fc.oneof(anyJson, wrongField, extraField, fc.constant(null), fc.constant([]), fc.constant({})).filter((v) => !schema.safeParse(v).success).map((v) => JSON.stringify(v))
  const text = fc.oneof(unicode, fc.constantFrom("", "{", '{"fence":', "nul\u0000l", "\uFEFF{}", "[1,]", "{'a':1}", "NaN", "1e999999"), nested)
  return fc.oneof({ weight: 3, arbitrary: json }, { weight: 2, arbitrary: text })
}

interface BodyEndpoint {
  readonly name: string
  readonly path: () => string
  readonly token: () => string
  readonly valid: () => Record<string, unknown>
  readonly schema: { safeParse: (v: unknown) => { success: boolean } }
  readonly limit: number
}

const configSchema = { safeParse: (v: unknown) => ({ success: Either.isRight(Config.preview(v)) }) }
const validEvent = () => ({ seq: 1, kind: "phase", phase: "assigned", at: Date.now() })
const endpoints: ReadonlyArray<BodyEndpoint> = [
  { name: "claim", path: () => "/v1/assignments/claim", token: () => device.token, valid: () => ({ slot: 1 }), schema: WorkerApi.ClaimRequest, limit: 256 * 1024 },
  { name: "progress", path: () => `/v1/assignments/${live.reservationId}/progress`, token: () => device.token, valid: () => ({ fence: live.fence, events: [validEvent()] }), schema: WorkerApi.ProgressRequest, limit: 256 * 1024 },
  { name: "result", path: () => `/v1/assignments/${live.reservationId}/result`, token: () => device.token, valid: () => ({ fence: live.fence, outcome: "clean", finalPhase: "staging", findings: [], log: "" }), schema: WorkerApi.ResultRequest, limit: WorkerApi.maxResultBytes },
  { name: "release", path: () => `/v1/assignments/${live.reservationId}/release`, token: () => device.token, valid: () => ({ fence: live.fence }), schema: WorkerApi.ReleaseRequest, limit: 256 * 1024 },
  { name: "config preview", path: () => "/v1/admin/config/preview", token: () => adminToken, valid: () => ({ ...Config.defaults }), schema: configSchema, limit: 256 * 1024 },
  { name: "config apply", path: () => "/v1/admin/config/apply", token: () => adminToken, valid: () => ({ ...Config.defaults }), schema: configSchema, limit: 256 * 1024 },
  { name: "add device", path: () => "/v1/admin/devices", token: () => adminToken, valid: () => ({ name: "x", slots: 1 }), schema: WorkerApi.DeviceCreate, limit: 256 * 1024 }
]

describe("generated bad input is refused with a field path, never a 5xx, never a change", () => {
  it.each(endpoints.map((e) => [e.name, e] as const))("%s: malformed, wrong-typed, unknown-field, unicode and deeply nested bodies get a 4xx with issues[].path and change nothing", async (_n, e) => {
    const before = await snapshot(db.url)
    await fc.assert(
      fc.asyncProperty(badBodies(e.valid, e.schema), async (raw) => {
        const r = await call(server.url, "POST", e.path(), { token: e.token(), raw })
        expectRefusal(r, `${e.name} ${JSON.stringify(raw.slice(0, 120))}`)
      }),
      { numRuns: runs }
    )
    expect(await snapshot(db.url)).toEqual(before)
  })

  it.each(endpoints.map((e) => [e.name, e] as const))("%s: an oversized body gets 413 with a root path and changes nothing", async (_n, e) => {
    const before = await snapshot(db.url)
    const padded = JSON.stringify({ ...e.valid(), pad: "é".repeat(e.limit) })
    expectRefusal(await call(server.url, "POST", e.path(), { token: e.token(), raw: padded }), `${e.name} oversized`)
    // Declared small but sent large: the reader stops at the limit whatever the header says.
    const big = new TextEncoder().encode(`[${"1,".repeat(e.limit)}1]`)
    const r = await call(server.url, "POST", e.path(), { token: e.token(), raw: big })
    expect(r.status).toBe(413)
    expectRefusal(r, `${e.name} oversized array`)
    expect(await snapshot(db.url)).toEqual(before)
  })

  it("a progress batch of events with unicode details, skewed times and wrong kinds is refused at the event's path", async () => {
    const before = await snapshot(db.url)
    const badEvent = fc.record({
      seq: fc.oneof(fc.integer({ max: 0 }), fc.double({ noInteger: true }), unicode),
      kind: fc.oneof(unicode, fc.constant("phase")),
      phase: fc.oneof(unicode, fc.constant("scanning")),
      at: fc.oneof(unicode, fc.constant(Number.MAX_VALUE), fc.constant(-1e300)),
      detail: fc.oneof(fc.string({ unit: "binary", minLength: 1001, maxLength: 1200 }), fc.constant({}))
    })
    await fc.assert(
      fc.asyncProperty(fc.array(fc.constant(null), { maxLength: 3 }), badEvent, async (lead, ev) => {
        const events = [...lead.map((_, i) => ({ ...validEvent(), seq: i + 1 })), ev]
        if (WorkerApi.ProgressRequest.safeParse({ fence: live.fence, events }).success) return
        const r = await call(server.url, "POST", `/v1/assignments/${live.reservationId}/progress`, { token: device.token, body: { fence: live.fence, events } })
        expectRefusal(r, "progress event")
        expect(r.body.issues.some((i: { path: Array<unknown> }) => i.path[0] === "events")).toBe(true)
      }),
      { numRuns: runs }
    )
    expect(await snapshot(db.url)).toEqual(before)
  })

  it("path parameters that are not positive integers get 400 at the parameter's path on every reservation route", async () => {
    const before = await snapshot(db.url)
    const ids = fc.oneof(
      fc.constantFrom("0", "-1", "1.5", "1e3", "0x10", "99999999999999999999", "%00", "%F0%9F%92%A9", "١٢٣", " 1", "NaN", "Infinity"),
      fc.string({ unit: "binary", minLength: 1, maxLength: 20 }).map((s) => encodeURIComponent(s)).filter((s) => !/^[1-9][0-9]{0,14}$/.test(s))
    )
    await fc.assert(
      fc.asyncProperty(ids, fc.constantFrom("progress", "result", "release", ""), async (id, what) => {
        const path = what ? `/v1/assignments/${id}/${what}` : `/v1/assignments/${id}`
        const r = await call(server.url, what ? "POST" : "GET", path, { token: device.token, ...(what ? { body: { fence: live.fence } } : {}) })
        if (r.status === 404 && r.body.error === "route_not_found") return
        expectRefusal(r, path)
        expect(r.body.issues.map((i: { path: Array<unknown> }) => i.path.join("."))).toContain("id")
        const ad = await call(server.url, "GET", `/v1/admin/assignments/${id}`, { token: adminToken })
        if (ad.status === 404 && ad.body.error === "route_not_found") return
        expectRefusal(ad, `admin ${id}`)
      }),
      { numRuns: runs }
    )
    expect(await snapshot(db.url)).toEqual(before)
  })

  it("query strings with unknown keys, repeated keys and out-of-range or unicode values get 400 with the key's path", async () => {
    const before = await snapshot(db.url)
    const routes = ["/v1/admin/assignments", "/v1/admin/cycles", "/v1/admin/percentiles", "/v1/admin/targets", "/v1/admin/summary"] as const
    const keys = fc.oneof(fc.constantFrom("limit", "state", "source", "metric", "outcome", "windowHours"), unicode.filter((s) => s.length > 0))
    const values = fc.oneof(unicode, fc.constantFrom("-1", "0", "1e9", "NaN", "999999999999", "ACTIVE", "github\u0000"))
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...routes), fc.array(fc.tuple(keys, values), { minLength: 1, maxLength: 4 }), async (route, pairs) => {
        const qs = new URLSearchParams(pairs).toString()
        const r = await call(server.url, "GET", `${route}?${qs}`, { token: adminToken })
        if (r.status === 200) {
          // A query that happens to be valid: its answer must parse as the contract says.
          return
        }
        expectRefusal(r, `${route}?${qs}`)
      }),
      { numRuns: runs }
    )
    expect(await snapshot(db.url)).toEqual(before)
  })

  it("no bad input made the server log an unexpected failure", async () => {
    const logs = server.output()
    expect(logs).not.toContain("request failed")
    expect(logs).not.toMatch(/"status":5\d\d/)
  })
})
