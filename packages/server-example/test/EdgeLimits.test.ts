import { type Operations, Store, WorkerApi } from "@scanfleet/core"
import { Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest"
import { z } from "zod"
import * as ApiReference from "../src/ApiReference.js"
import * as Database from "../src/Database.js"
import { pgDatabase, sqliteFile } from "./fixtures/Databases.js"
import { adminToken, call, liveReservation, sendPast, start, type Running } from "./fixtures/Harness.js"

/**
 * The limits of the HTTP edge, generated from the route table in
 * `ApiReference.ts` (the same table docs/api is rendered from): every string an
 * endpoint reads, in its body, its query, its path or its headers, is tried with
 * a NUL, an unpaired surrogate and one character past its documented length,
 * against a server on each real database. Every one is a 400 at the string's
 * path and the database is unchanged; nothing is ever a 5xx.
 */

type Json = null | boolean | number | string | ReadonlyArray<Json> | { readonly [k: string]: Json }
type Path = ReadonlyArray<string | number>

const endpoints = [...ApiReference.worker, ...ApiReference.admin]
const name = (e: ApiReference.Endpoint) => `${e.method} ${e.path}`
const byName = (n: string) => endpoints.find((e) => name(e) === n)!

/** Every string leaf of a JSON value, with its path. */
const leaves = (v: Json, path: Path = []): Array<Path> =>
  typeof v === "string"
    ? [path]
    : Array.isArray(v)
      ? v.flatMap((x, i) => leaves(x, [...path, i]))
      : typeof v === "object" && v !== null
        ? Object.entries(v).flatMap(([k, x]) => leaves(x, [...path, k]))
        : []

const setAt = (v: Json, path: Path, value: Json): Json => {
  if (path.length === 0) return value
  const [head, ...rest] = path
  if (Array.isArray(v)) return v.map((x, i) => (i === head ? setAt(x, rest, value) : x))
  const o = v as { readonly [k: string]: Json }
  return { ...o, [head as string]: setAt(o[head as string], rest, value) }
}

/** The `maxLength` the endpoint's schema declares at a path, if any (the edge's own limit applies beyond it). */
const maxLengthAt = (schema: z.ZodType, path: Path): number => {
  let node: any = z.toJSONSchema(schema, { io: "input", unrepresentable: "any" })
  for (const k of path) {
    if (node === undefined) break
    node = typeof k === "number" ? node.items : (node.properties?.[k] ?? node.additionalProperties)
  }
  return typeof node?.maxLength === "number" ? node.maxLength : WorkerApi.maxStringLength
}

const backends: ReadonlyArray<[string, () => { layer: () => Layer.Layer<Store.Store | Operations.Operations, unknown>; cleanup: () => Promise<void> | void } | Promise<{ layer: () => Layer.Layer<Store.Store | Operations.Operations, unknown>; cleanup: () => Promise<void> | void }>]> = [
  [
    "SQLite",
    () => {
      const f = sqliteFile()
      return { layer: () => Database.layer(f.url), cleanup: f.cleanup }
    }
  ],
  [
    "PostgreSQL",
    async () => {
      const db = await pgDatabase(inject("pgUrl"))
      return { layer: () => Database.layer(db.url, { poolSize: 3 }), cleanup: db.cleanup }
    }
  ]
]

describe.each(backends)("the HTTP edge on %s", (_name, open) => {
  let s: Running
  let cleanup: () => Promise<void> | void = () => {}
  let token = ""
  let deviceId = 0
  let live = { reservationId: 0, fence: 0 }

  beforeAll(async () => {
    const db = await open()
    cleanup = db.cleanup
    s = await start({ storeLayer: db.layer() })
    ;({ token, deviceId, live } = await liveReservation(s))
  })
  afterAll(async () => {
    await s?.close()
    await cleanup()
  })

  // The ids and fence of the live reservation, so a string that slipped through the edge would reach the store.
  const pathOf = (e: ApiReference.Endpoint) => e.path.replace(":id", String(e.path.includes("devices") ? deviceId : live.reservationId))
  const tokenOf = (e: ApiReference.Endpoint) => (e.auth === "device" ? token : adminToken)
  const exampleOf = (e: ApiReference.Endpoint): Json => {
    const ex = e.example as Json
    return typeof ex === "object" && ex !== null && !Array.isArray(ex) && "fence" in ex ? { ...ex, fence: live.fence } : ex
  }
  const snapshot = () =>
    s.run(
      Effect.flatMap(Store.Store, (st) => Effect.all([st.countTargets(), st.listAssignments({ limit: 100 }), st.timeline(live.reservationId), st.activeConfig(), st.listCycles({ limit: 10 })])).pipe(Effect.orDie)
    )
  const expect400At = (r: { status: number; body: any }, path: Path, what: string) => {
    expect(r.status, `${what}: ${JSON.stringify(r.body).slice(0, 300)}`).toBe(400)
    expect(WorkerApi.ErrorBody.safeParse(r.body).success, what).toBe(true)
    expect(r.body.issues.map((i: { path: Path }) => i.path.join(".")), what).toContain(path.join("."))
  }

  const bodies = endpoints.filter((e) => e.body !== undefined)
  it("every endpoint that reads a body has an example its schema accepts (the cases below start from it)", () => {
    expect(bodies.length).toBeGreaterThanOrEqual(7)
    for (const e of bodies) expect(e.body!.safeParse(e.example).success, `${e.method} ${e.path}`).toBe(true)
  })

  it.each(bodies.map(name))("%s: a NUL, an unpaired surrogate or one character too many in any string or key of the body is a 400 at its path", async (n) => {
    const e = byName(n)
    const before = await snapshot()
    const base = exampleOf(e)
    // Strings of the example, plus a key and a value added where the schema takes any (findings) or refuses unknown keys.
    const cases: Array<{ path: Path; body: Json }> = []
    for (const p of leaves(base)) {
      const max = maxLengthAt(e.body!, p)
      for (const bad of ["a\u0000b", "a\ud800b", "x".repeat(max + 1)]) cases.push({ path: p, body: setAt(base, p, bad) })
    }
    const extraAt: Path = e.path.endsWith("/result") ? ["findings", 0] : []
    const host = extraAt.reduce<any>((v, k) => v[k], base)
    for (const key of ["k\u0000", "k\udc00", "k".repeat(WorkerApi.maxKeyLength + 1)]) cases.push({ path: [...extraAt, key], body: setAt(base, extraAt, { ...host, [key]: 1 }) })
    for (const c of cases) {
      const r = await call(s.url + pathOf(e), tokenOf(e), e.method, c.body)
      expect400At(r, c.path, `${e.method} ${e.path} at ${c.path.join(".").slice(0, 80)}`)
    }
    expect(await snapshot()).toEqual(before)
  })

  it.each(bodies.map(name))("%s: a body nested 4,000 levels deep is a 400 too_deep", async (n) => {
    const e = byName(n)
    const before = await snapshot()
    const deep = "[".repeat(4000) + "]".repeat(4000)
    const text = JSON.stringify(exampleOf(e)).replace(/^\{/, `{"deep":${deep},`)
    const r = await call(s.url + pathOf(e), tokenOf(e), e.method, undefined, text)
    expect(r.status, JSON.stringify(r.body)).toBe(400)
    expect(r.body.error).toBe("too_deep")
    expect(await snapshot()).toEqual(before)
  })

  const withQuery = endpoints.filter((e) => e.query !== undefined)
  it.each(withQuery.map(name))("%s: a query key or value with a NUL or past its length is a 400 at the key", async (n) => {
    const e = byName(n)
    const keys = Object.keys((z.toJSONSchema(e.query!, { io: "input" }) as { properties?: object }).properties ?? {})
    for (const k of [...keys, "unknown"])
      for (const v of ["a\u0000", "x".repeat(WorkerApi.maxQueryLength + 1)]) {
        const r = await call(`${s.url}${pathOf(e)}?${new URLSearchParams([[k, v]])}`, tokenOf(e), e.method)
        expect400At(r, [k], `${e.path}?${k}`)
      }
    const r = await call(`${s.url}${pathOf(e)}?${new URLSearchParams([["k".repeat(WorkerApi.maxQueryLength + 1), "1"]])}`, tokenOf(e), e.method)
    expect(r.status).toBe(400)
  })

  const withHeaders = endpoints.filter((e) => e.headers !== undefined)
  it.each(withHeaders.map(name))("%s: a header it reads with a control character or past its length is a 400", async (n) => {
    const e = byName(n)
    const before = await snapshot()
    for (const [h, max] of Object.entries(e.headers!))
      for (const v of ["a\tb", "x".repeat(max + 1), "\u00e9".repeat(max + 1)]) {
        const res = await fetch(s.url + pathOf(e), {
          method: e.method,
          headers: { authorization: `Bearer ${tokenOf(e)}`, "content-type": "application/json", [h]: Buffer.from(v, "latin1").toString("latin1") },
          body: JSON.stringify(exampleOf(e))
        })
        const body = await res.json()
        expect400At({ status: res.status, body }, ["headers", h.toLowerCase()], `${h}: ${v.slice(0, 10)}`)
      }
    expect(await snapshot()).toEqual(before)
  })

  const withId = endpoints.filter((e) => e.path.includes(":id"))
  it.each(withId.map(name))("%s: an id that is not exactly its schema (1;x, 1/, 01, an encoded semicolon) is a 400 invalid_path", async (n) => {
    const e = byName(n)
    const before = await snapshot()
    const id = e.path.includes("devices") ? deviceId : live.reservationId
    for (const bad of [`${id};x`, `${id}/`, `0${id}`, `${id}%3B`, `${id};`]) {
      const path = e.path.replace(":id", bad)
      const r = await call(s.url + path, tokenOf(e), e.method, e.body ? exampleOf(e) : undefined)
      // `1/` with more path after it leaves an empty segment that no route has: 404, never the resource 1
      if (bad.endsWith("/") && !e.path.endsWith(":id") && r.status === 404 && r.body.error === "route_not_found") continue
      expect400At(r, ["id"], `${e.method} ${path}`)
      expect(r.body.error).toBe("invalid_path")
    }
    expect(await snapshot()).toEqual(before)
  })

  it("a result whose findings nest exactly to the depth limit is accepted; one level deeper is refused", async () => {
    const slot1 = await s.device(token, "POST", "/v1/assignments/claim", { slot: 1 })
    await s.run(Effect.flatMap(Store.Store, (st) => st.recordObservations([{ source: "github", identity: "edge/deep", remoteAt: null }], Date.now())))
    const c = slot1.body.assignment ?? (await s.device(token, "POST", "/v1/assignments/claim", { slot: 1 })).body.assignment
    // body (1) > findings (2) > finding (3) > details (4) > ... : the innermost array is at the limit
    let inner: Json = ["bottom"]
    for (let d = 5; d < WorkerApi.maxJsonDepth; d++) inner = [inner]
    const finding = { scanner: "custom", detector: "deep", path: "x", fingerprint: `hmac-sha256:${"cd".repeat(32)}`, preview: "" }
    const body = { fence: c.fence, outcome: "findings", finalPhase: "staging", findings: [{ ...finding, details: { nested: inner } }], log: "" }
    const r = await s.device(token, "POST", `/v1/assignments/${c.reservationId}/result`, body)
    expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBe(200)
    const tooDeep = await s.device(token, "POST", `/v1/assignments/${c.reservationId}/result`, { ...body, findings: [{ ...finding, details: { nested: [inner] } }] })
    expect(tooDeep.status).toBe(400)
    expect(tooDeep.body.error).toBe("too_deep")
  })

  it("a chunked body over its limit is answered 413 once the limit is crossed, before the body ends, and the connection is closed", async () => {
    const before = await snapshot()
    const limit = 256 * 1024
    // The body is never finished: only an answer given once the limit is crossed arrives at all.
    const answer = await sendPast(s.url, {
      path: "/v1/assignments/claim",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json", "transfer-encoding": "chunked" },
      head: '{"slot":0,"pad":"',
      fill: "x",
      limit
    })
    expect(answer.status).toBe(413)
    expect(JSON.parse(answer.body).error).toBe("payload_too_large")
    expect(answer.headers.connection).toBe("close")
    expect(await snapshot()).toEqual(before)
  })
})
