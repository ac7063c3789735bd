import { Store, WorkerApi } from "@scanfleet/core"
import { Effect } from "effect"
import { connect } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as ApiReference from "../src/ApiReference.js"
import * as Database from "../src/Database.js"
import * as Request from "../src/internal/Request.js"
import { sqliteFile } from "./fixtures/Databases.js"
import { adminToken, liveReservation, start, type Running } from "./fixtures/Harness.js"

/**
 * What reaches the server exactly as a client sent it, on a raw socket (fetch and
 * http.request normalise or refuse much of it): path parameters with `;`, a trailing
 * slash or percent-encoded bytes that are not UTF-8, query keys on endpoints that
 * take none, and requests Node's HTTP parser refuses before any handler runs. Every
 * refusal is a complete response with the JSON error body, and changes nothing.
 */

interface Exchange {
  /** Everything the server sent before it closed the connection. */
  readonly raw: string
  readonly status: number
  readonly headers: Readonly<Record<string, string>>
  readonly text: string
  readonly body: any
}

/** Sends `request` on a fresh connection and reads until the server closes it (a reset after the answer is a close too). */
// `then`, when given, is written once the first bytes of the answer have arrived.
const exchange = (port: number, request: string | Buffer, timeoutMs = 20_000, then?: string) =>
  new Promise<Exchange>((resolve, reject) => {
    const socket = connect(port, "127.0.0.1")
    const chunks: Array<Buffer> = []
    const timer = setTimeout(() => {
      socket.destroy()
      reject(new Error(`the server left the connection open ${timeoutMs} ms; it sent ${JSON.stringify(Buffer.concat(chunks).toString("latin1").slice(0, 300))}`))
    }, timeoutMs)
    const done = () => {
      clearTimeout(timer)
      const raw = Buffer.concat(chunks).toString("utf8")
      const head = raw.indexOf("\r\n\r\n")
      const lines = (head === -1 ? raw : raw.slice(0, head)).split("\r\n")
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? "")?.[1] ?? 0)
      const headers: Record<string, string> = {}
      for (const l of lines.slice(1)) {
        const i = l.indexOf(":")
        if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim()
      }
      let text = head === -1 ? "" : raw.slice(head + 4)
      if (headers["transfer-encoding"] === "chunked") {
        let out = ""
        for (let rest = text; ; ) {
          const nl = rest.indexOf("\r\n")
          const size = parseInt(rest.slice(0, nl), 16)
          if (!(size > 0)) break
          out += rest.slice(nl + 2, nl + 2 + size)
          rest = rest.slice(nl + 2 + size + 2)
        }
        text = out
      }
      let body: unknown = undefined
      try {
        body = JSON.parse(text)
      } catch {
        // not JSON
      }
      resolve({ raw, status, headers, text, body })
    }
    socket.on("data", (c: Buffer) => {
      if (then !== undefined && chunks.length === 0 && socket.writable) socket.write(then)
      chunks.push(c)
    })
    socket.on("close", done)
    socket.on("error", () => {}) // a reset after the answer: `close` follows
    socket.write(request)
  })

/** One well-formed request with `Connection: close`, its target sent byte for byte. */
const http11 = (method: string, target: string, token: string | null, body?: unknown) => {
  const text = body === undefined ? "" : JSON.stringify(body)
  const headers = [
    `${method} ${target} HTTP/1.1`,
    "Host: 127.0.0.1",
    ...(token ? [`Authorization: Bearer ${token}`] : []),
    ...(body === undefined ? [] : ["Content-Type: application/json", `Content-Length: ${Buffer.byteLength(text)}`]),
    "Connection: close"
  ]
  return `${headers.join("\r\n")}\r\n\r\n${text}`
}

/** A refusal as the API reference documents it: a complete response whose body is exactly the error body. */
const expectRefusal = (r: Exchange, status: number, error: string, what: string) => {
  expect(r.status, `${what}: ${JSON.stringify(r.raw.slice(0, 400))}`).toBe(status)
  expect(r.body?.error, `${what}: ${r.text.slice(0, 300)}`).toBe(error)
  expect(WorkerApi.ErrorBody.safeParse(r.body).success, `${what}: ${r.text.slice(0, 300)}`).toBe(true)
  expect(typeof r.body.message, what).toBe("string")
  expect(r.headers["content-type"], what).toMatch(/^application\/json/)
  if (r.headers["content-length"] !== undefined) expect(Number(r.headers["content-length"]), what).toBe(Buffer.byteLength(r.text))
}

const expectInvalidAt = (r: Exchange, error: "invalid_path" | "invalid_query", at: string, what: string) => {
  expectRefusal(r, 400, error, what)
  expect(
    r.body.issues?.map((i: { path: ReadonlyArray<string | number> }) => i.path.join(".")),
    `${what}: ${r.text.slice(0, 300)}`
  ).toContain(at)
}

describe("the HTTP edge, byte for byte, on SQLite", () => {
  let s: Running
  let cleanup: () => void = () => {}
  let port = 0
  let token = ""
  let deviceId = 0
  let live = { reservationId: 0, fence: 0 }

  beforeAll(async () => {
    const f = sqliteFile()
    cleanup = f.cleanup
    s = await start({ storeLayer: Database.layer(f.url) })
    port = Number(new URL(s.url).port)
    ;({ token, deviceId, live } = await liveReservation(s))
  })
  afterAll(async () => {
    await s?.close()
    cleanup()
  })

  // Everything a refused request could have changed: targets, assignments and the live timeline, config, sources, devices, audit.
  const snapshot = async () => ({
    store: await s.run(
      Effect.flatMap(Store.Store, (st) => Effect.all([st.countTargets(), st.listAssignments({ limit: 100 }), st.timeline(live.reservationId), st.activeConfig()])).pipe(Effect.orDie)
    ),
    sources: (await s.admin("GET", "/v1/admin/sources")).body,
    // without the views' clock-relative fields (remainingMs, serverNow)
    devices: (await s.admin("GET", "/v1/admin/devices")).body.devices.map((d: any) => ({ ...d, active: d.active.map((a: any) => [a.reservationId, a.state, a.fence]) })),
    audit: (await s.admin("GET", "/v1/admin/audit")).body
  })

  const reason = { reason: "edge test" }
  // Requests each valid but for the parameter: method, route, token, body, the parameter, a valid value of it.
  const withIds = () =>
    [
      ["POST", "/v1/assignments/:id/progress", token, { fence: live.fence, events: [{ seq: 1, kind: "phase", phase: "assigned", at: Date.now(), detail: "x" }] }, "id", live.reservationId],
      ["POST", "/v1/assignments/:id/result", token, { fence: live.fence, outcome: "clean", finalPhase: "staging", findings: [], log: "" }, "id", live.reservationId],
      ["POST", "/v1/assignments/:id/release", token, { fence: live.fence }, "id", live.reservationId],
      ["GET", "/v1/assignments/:id", token, undefined, "id", live.reservationId],
      ["GET", "/v1/admin/assignments/:id", adminToken, undefined, "id", live.reservationId],
      ["POST", "/v1/admin/assignments/:id/cancel", adminToken, reason, "id", live.reservationId],
      ["POST", "/v1/admin/devices/:id/sources", adminToken, { sources: [], ...reason }, "id", deviceId],
      ["DELETE", "/v1/admin/devices/:id", adminToken, undefined, "id", deviceId],
      ["GET", "/v1/admin/findings/scans/:id", adminToken, undefined, "id", live.reservationId],
      ["POST", "/v1/admin/findings/webhook/dead-letters/:seq/redeliver", adminToken, undefined, "seq", 1]
    ] as const

  it("an id with a `;` or a `#` is a 400 invalid_path at the parameter, whatever follows it, on every route with an id", async () => {
    const before = await snapshot()
    for (const [method, route, who, body, param, id] of withIds())
      for (const bad of [`${id};x`, `${id};`, `${id};x=1`, `${id}#x`]) {
        const target = route.replace(`:${param}`, bad)
        expectInvalidAt(await exchange(port, http11(method, target, who, body)), "invalid_path", param, `${method} ${target}`)
      }
    expect(await snapshot()).toEqual(before)
  })

  it("a source with a `;` or a trailing slash is a 400 invalid_path at `source`, and the source is not paused", async () => {
    const before = await snapshot()
    for (const action of ["pause", "resume"])
      for (const target of [`/v1/admin/sources/github;x/${action}`, `/v1/admin/sources/gitlab/${action}/`, `/v1/admin/sources/gitlab;/${action}`, `/v1/admin/sources/gitlab%3B/${action}`])
        expectInvalidAt(await exchange(port, http11("POST", target, adminToken, reason)), "invalid_path", "source", target)
    expect(await snapshot()).toEqual(before)
    // the same request without the slash does take effect
    const paused = await exchange(port, http11("POST", "/v1/admin/sources/gitlab/pause", adminToken, reason))
    expect(paused.status, paused.text).toBe(200)
    expect(paused.body.paused).toBe(true)
    expect((await exchange(port, http11("POST", "/v1/admin/sources/gitlab/resume", adminToken, reason))).status).toBe(200)
  })

  it("a path parameter whose percent-encoding is not UTF-8 is a 400 invalid_path at the parameter", async () => {
    const before = await snapshot()
    for (const bad of ["%ED%A0%80", "%FF", "%C3", "%E2%82", "1%FF", "%G1", "%"]) {
      for (const [method, route, who, body, param] of withIds()) {
        const target = route.replace(`:${param}`, bad)
        expectInvalidAt(await exchange(port, http11(method, target, who, body)), "invalid_path", param, `${method} ${target}`)
      }
      for (const action of ["pause", "resume"]) {
        const target = `/v1/admin/sources/${bad}/${action}`
        expectInvalidAt(await exchange(port, http11("POST", target, adminToken, reason)), "invalid_path", "source", target)
      }
    }
    expect(await snapshot()).toEqual(before)
  })

  const queryless = [...ApiReference.worker, ...ApiReference.admin, ...ApiReference.operations, ...ApiReference.other].filter((e) => e.path.startsWith("/v1/") && e.query === undefined)
  it.each(queryless.map((e) => `${e.method} ${e.path}`))("%s takes no query: any query key is a 400 invalid_query at the key, and nothing changes", async (name) => {
    const e = queryless.find((x) => `${x.method} ${x.path}` === name)!
    const before = await snapshot()
    const path = e.path
      .replace(":id", String(e.path.includes("devices") ? deviceId : live.reservationId))
      .replace(":source", "gitlab")
      .replace(":seq", "1")
    const body = e.example ?? (e.body ? reason : undefined)
    const who = e.auth === "device" ? token : adminToken
    for (const [query, key] of [
      ["x=%00&x=2", "x"],
      ["by=%00", "by"],
      ["reason=x", "reason"],
      ["x", "x"]
    ] as const)
      expectInvalidAt(await exchange(port, http11(e.method, `${path}?${query}`, who, body)), "invalid_query", key, `${e.method} ${path}?${query}`)
    expect(await snapshot()).toEqual(before)
  })

  it("an endpoint that takes a query still reads it (the query check applies only where none is documented)", async () => {
    const r = await exchange(port, http11("GET", "/v1/admin/assignments?state=active&limit=5", adminToken))
    expect(r.status, r.text).toBe(200)
    expectInvalidAt(await exchange(port, http11("GET", "/v1/admin/assignments?state=active&state=active", adminToken)), "invalid_query", "state", "repeated key")
  })

  it("a query key or value whose percent-decoded bytes are not UTF-8 is a 400 invalid_query at its key, never read as replacement characters", async () => {
    const search = "/v1/admin/targets/search"
    for (const [query, key] of [
      ["prefix=%FF", "prefix"],
      ["prefix=a%C0%AF", "prefix"],
      ["prefix=%ED%A0%80", "prefix"],
      ["source=github&prefix=%E2%82", "prefix"],
      ["%FF=1", "%FF"]
    ] as const)
      expectInvalidAt(await exchange(port, http11("GET", `${search}?${query}`, adminToken)), "invalid_query", key, query)
    // UTF-8, a space as `+` and a `%` that escapes nothing are read as the form encoding reads them
    for (const query of ["prefix=%C5%81ukasz", "prefix=a+b", "prefix=100%25", "prefix=%zz"]) {
      const r = await exchange(port, http11("GET", `${search}?${query}`, adminToken))
      expect(r.status, `${query}: ${r.text.slice(0, 300)}`).toBe(200)
    }
  })

  it("the query is read as the form encoding reads it, but for bytes that are not UTF-8", () => {
    expect(Request.queryPairs("/x?a=%C5%81&b=x+y&c=%zz&&d&e=1=2#f=3")).toEqual([
      ["a", "a", "Ł"],
      ["b", "b", "x y"],
      ["c", "c", "%zz"],
      ["d", "d", ""],
      ["e", "e", "1=2"]
    ])
    expect(Request.queryPairs("/x?a=%FF&%C3=1")).toEqual([
      ["a", "a", undefined],
      ["%C3", undefined, "1"]
    ])
    expect(Request.queryPairs("/x")).toEqual([])
  })

  // Every number a query takes: the path (with the query the endpoint needs besides) and the field.
  const numbers = [
    ["/v1/admin/assignments", "limit"],
    ["/v1/admin/cycles", "limit"],
    ["/v1/admin/percentiles", "windowHours"],
    ["/v1/admin/targets/search", "after"],
    ["/v1/admin/targets/search", "limit"],
    ["/v1/admin/targets/inspect?source=github&identity=edge%2Fa", "limit"],
    ["/v1/admin/audit", "before"],
    ["/v1/admin/audit", "limit"],
    ["/v1/admin/findings", "after"],
    ["/v1/admin/findings", "limit"]
  ] as const
  it("a number in a query is decimal digits: `1e1`, ` 1`, `0x10`, `+1`, `1_0`, `Infinity` and an empty value are a 400 invalid_query at the field", async () => {
    const at = (path: string, field: string, value: string) => `${path}${path.includes("?") ? "&" : "?"}${field}=${value}`
    for (const [path, field] of numbers) {
      const ok = await exchange(port, http11("GET", at(path, field, "5"), adminToken))
      expect(ok.status, `${at(path, field, "5")}: ${ok.text.slice(0, 300)}`).toBe(200)
      const bad = ["1e1", "%201", "1%20", "0x10", "%2B1", "1_0", "Infinity", "", "-1", ...(field === "windowHours" ? ["1.", ".5", "1.5e1"] : ["1.0", "1.5"])]
      for (const value of bad) expectInvalidAt(await exchange(port, http11("GET", at(path, field, value), adminToken)), "invalid_query", field, at(path, field, value))
    }
    // a decimal is a number of hours
    expect((await exchange(port, http11("GET", "/v1/admin/percentiles?windowHours=0.5", adminToken))).body.windowHours).toBe(0.5)
  })

  it("a console action or asset path with a trailing slash is a 400 invalid_path, an action name with `;` is an unknown action, and the source is not paused", async () => {
    const login = await fetch(`${s.url}/?token=${adminToken}`, { redirect: "manual" })
    const cookie = /scanfleet_admin=[^;]+/.exec(login.headers.get("set-cookie") ?? "")?.[0] ?? ""
    const page = await fetch(`${s.url}/console/sources`, { headers: { cookie } })
    const csrf = /name="csrf" value="([0-9a-f]+)"/.exec(await page.text())?.[1] ?? ""
    expect(csrf).not.toBe("")
    const form = new URLSearchParams({ csrf, back: "/console/sources", source: "gitlab", reason: "edge test" }).toString()
    const post = (target: string) =>
      `POST ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: ${cookie}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: ${form.length}\r\nConnection: close\r\n\r\n${form}`
    const before = await snapshot()
    for (const target of ["/console/actions/pause/", "/console/actions/pause%00"]) {
      const r = await exchange(port, post(target))
      expect(r.status, `${target}: ${r.text.slice(0, 300)}`).toBe(400)
      expect(r.text, target).toContain("action")
    }
    // a segment that is not an action's name is an unknown action, refused on the page the form came from
    for (const target of ["/console/actions/pause;x", "/console/actions/pause%3B"]) {
      const r = await exchange(port, post(target))
      expect(r.status, `${target}: ${r.text.slice(0, 300)}`).toBe(303)
      expect(new URL(r.headers.location ?? "", s.url).searchParams.get("refused"), target).toMatch(/^unknown action pause;x?$/)
    }
    expect(await snapshot()).toEqual(before)
    // the same form without the slash does take effect
    const done = await exchange(port, post("/console/actions/pause"))
    expect(done.status, done.text.slice(0, 300)).toBe(303)
    expect((await s.admin("GET", "/v1/admin/sources")).body.sources.find((x: any) => x.source === "gitlab")?.paused).toBe(true)
    expect((await exchange(port, post("/console/actions/resume"))).status).toBe(303)
    expectInvalidAt(await exchange(port, http11("GET", "/assets/uplot.css/", null)), "invalid_path", "name", "/assets/uplot.css/")
    expect((await exchange(port, http11("GET", "/assets/uplot.css;x", null))).status).toBe(404)
    expect((await exchange(port, http11("GET", "/assets/uplot.css", null))).status).toBe(200)
  })

  it("X-Scanfleet-Actor over 200 characters or with a control character is a 400 invalid_header on every operator write, and nothing changes", async () => {
    const before = await snapshot()
    const writes = [...ApiReference.operations, ...ApiReference.admin].filter((e) => e.headers?.["X-Scanfleet-Actor"] !== undefined)
    expect(writes.map((e) => `${e.method} ${e.path}`)).toContain("POST /v1/admin/targets/requeue")
    for (const e of writes) {
      const path = e.path.replace(":id", String(e.path.includes("devices") ? deviceId : live.reservationId)).replace(":source", "gitlab")
      const bodies: Record<string, unknown> = {
        "POST /v1/admin/targets": { targets: [{ source: "github", identity: "edge/actor" }], ...reason },
        "POST /v1/admin/targets/requeue": { source: "github", identity: "edge/a", ...reason },
        "POST /v1/admin/targets/priority": { source: "github", identity: "edge/a", priority: 5, ...reason },
        "POST /v1/admin/devices/:id/sources": { sources: [], ...reason }
      }
      const body = bodies[`${e.method} ${e.path}`] ?? e.example ?? (e.body ? reason : undefined)
      // too long, a C0 control, a C1 control and a bidirectional override (sent as UTF-8), and bytes that are not UTF-8 (Latin-1)
      for (const actor of ["a".repeat(201), "carol\tx", "carol\u009b2J", "carol\u202eevil", Buffer.from("Léon", "latin1")]) {
        const text = body === undefined ? "" : JSON.stringify(body)
        const head = [`${e.method} ${path} HTTP/1.1`, "Host: 127.0.0.1", `Authorization: Bearer ${adminToken}`, "X-Scanfleet-Actor: "].join("\r\n")
        const rest = ["", ...(body === undefined ? [] : ["Content-Type: application/json", `Content-Length: ${Buffer.byteLength(text)}`]), "Connection: close"].join("\r\n")
        const r = await exchange(port, Buffer.concat([Buffer.from(head), typeof actor === "string" ? Buffer.from(actor) : actor, Buffer.from(`${rest}\r\n\r\n${text}`)]))
        expectRefusal(r, 400, "invalid_header", `${e.method} ${path} with the actor ${JSON.stringify(String(actor).slice(0, 20))}`)
      }
    }
    expect(await snapshot()).toEqual(before)
    // within the limit, trimmed, it names who acted
    const ok = await exchange(port, http11("POST", "/v1/admin/sources/gitlab/pause", adminToken, reason).replace("Connection: close", `X-Scanfleet-Actor:   ${"c".repeat(200)}  \r\nConnection: close`))
    expect(ok.status, ok.text).toBe(200)
    expect((await s.admin("GET", "/v1/admin/audit?limit=1")).body.entries[0].who).toBe("c".repeat(200))
    // a name beyond Latin-1, sent as UTF-8 as curl sends it, is kept as written
    const named = await exchange(port, http11("POST", "/v1/admin/sources/gitlab/resume", adminToken, reason).replace("Connection: close", "X-Scanfleet-Actor: Łukasz Żółć 👩‍💻\r\nConnection: close"))
    expect(named.status, named.text).toBe(200)
    expect((await s.admin("GET", "/v1/admin/audit?limit=1")).body.entries[0].who).toBe("Łukasz Żółć 👩‍💻")
    await s.admin("POST", "/v1/admin/sources/gitlab/pause", reason)
    expect((await exchange(port, http11("POST", "/v1/admin/sources/gitlab/resume", adminToken, reason))).status).toBe(200)
  })

  describe("requests Node's HTTP parser refuses are answered with the JSON error body and Connection: close", () => {
    const post = (headers: string, body = "") => `POST /v1/assignments/claim HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer TOKEN\r\n${headers}\r\n${body}`
    const cases: ReadonlyArray<readonly [string, () => string | Buffer, number, string]> = [
      ["an invalid chunk size", () => post("Transfer-Encoding: chunked\r\n", "zz\r\n{}\r\n0\r\n\r\n"), 400, "bad_request"],
      ["both Content-Length and Transfer-Encoding", () => post("Content-Length: 2\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"), 400, "bad_request"],
      ["a negative Content-Length", () => post("Content-Length: -1\r\n", "{}"), 400, "bad_request"],
      ["two Content-Length headers", () => post("Content-Length: 2\r\nContent-Length: 3\r\n", '{}x'), 400, "bad_request"],
      ["a raw space in the request target", () => "GET /v1/admin/config x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400, "bad_request"],
      ["a non-ASCII byte in the request target", () => Buffer.concat([Buffer.from("GET /v1/assignments/"), Buffer.from([0xff]), Buffer.from(" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")]), 400, "bad_request"],
      ["a request line that is not HTTP", () => "HELLO\r\n\r\n", 400, "bad_request"],
      ["an HTTP/1.1 request without Host", () => "GET /v1/admin/config HTTP/1.1\r\nConnection: close\r\n\r\n", 400, "bad_request"],
      ["headers over 16 KiB", () => `GET /v1/admin/config HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ${"a".repeat(17 * 1024)}\r\n\r\n`, 431, "headers_too_large"],
      ["a request target over 16 KiB", () => `GET /v1/admin/config?pad=${"a".repeat(17 * 1024)} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`, 431, "headers_too_large"],
      ["CONNECT", () => "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 400, "bad_request"]
    ]
    it.each(cases.map(([what]) => what))("%s", async (what) => {
      const [, request, status, error] = cases.find(([w]) => w === what)!
      const before = await snapshot()
      const req = request()
      const r = await exchange(port, typeof req === "string" ? req.replace("TOKEN", token) : req)
      expectRefusal(r, status, error, what)
      expect(r.headers.connection, what).toBe("close")
      expect(r.headers["content-length"], `${what}: a Content-Length`).toBeDefined()
      // exactly one response on the wire
      expect(r.raw.match(/HTTP\/1\.1 \d{3} /g)?.length, r.raw.slice(0, 300)).toBe(1)
      expect(await snapshot()).toEqual(before)
    })

    it("a malformed request after an answered one on the same connection gets its own refusal, after the first answer complete", async () => {
      const r = await exchange(port, `GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /v1/a b HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`)
      const answers = r.raw.split(/(?=HTTP\/1\.1 \d{3} )/)
      expect(answers.length, r.raw).toBe(2)
      expect(answers[0]).toMatch(/^HTTP\/1\.1 200 /)
      expect(answers[0].endsWith(JSON.stringify({ ok: true, status: "alive" })), answers[0]).toBe(true)
      expect(answers[1]).toMatch(/^HTTP\/1\.1 400 /)
      expect(JSON.parse(answers[1].slice(answers[1].indexOf("\r\n\r\n") + 4)).error).toBe("bad_request")
    })

    it("a malformed request pipelined behind one still being answered is refused after that answer, never in its place", async () => {
      const r = await exchange(port, `GET /v1/admin/config HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${adminToken}\r\n\r\nGET /v1/a b HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`)
      const answers = r.raw.split(/(?=HTTP\/1\.1 \d{3} )/)
      expect(answers.length, r.raw.slice(0, 400)).toBe(2)
      expect(answers[0]).toMatch(/^HTTP\/1\.1 200 /)
      expect(JSON.parse(answers[0].slice(answers[0].indexOf("\r\n\r\n") + 4)).origin).toBeDefined()
      expect(answers[1]).toMatch(/^HTTP\/1\.1 400 /)
      expect(JSON.parse(answers[1].slice(answers[1].indexOf("\r\n\r\n") + 4)).error).toBe("bad_request")
    })

    it("an Expect other than 100-continue is a 417 with the JSON error body", async () => {
      const r = await exchange(port, "GET /v1/admin/config HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: teapot\r\nConnection: close\r\n\r\n")
      expectRefusal(r, 417, "expectation_failed", "Expect: teapot")
    })

    it("a body that breaks the chunked framing after the server has answered gets no second response", async () => {
      // 413 is answered as soon as the first chunk crosses the limit; the broken framing, sent once that
      // answer arrives, must not add bytes to it (sent together, the parser may reach it first: then the one
      // answer is a 400)
      const big = "x".repeat(300 * 1024)
      const r = await exchange(port, `${post("Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n").replace("TOKEN", token)}${big.length.toString(16)}\r\n${big}\r\n`, 20_000, "zz\r\n")
      expect(r.raw.match(/HTTP\/1\.1 \d{3} /g)?.length, r.raw.slice(0, 300)).toBe(1)
      expectRefusal(r, 413, "payload_too_large", "oversized then broken")
    })
  })

  it("the server still answers normally afterwards", async () => {
    const r = await exchange(port, http11("GET", `/v1/assignments/${live.reservationId}`, token))
    expect(r.status, r.text).toBe(200)
    expect(r.body.reservationId).toBe(live.reservationId)
  })
})
