import { request } from "node:http"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Console from "../src/Console.js"
import * as Database from "../src/Database.js"
import { sqliteFile } from "./fixtures/Databases.js"
import { adminToken, sendPast, start, type Running } from "./fixtures/Harness.js"

/**
 * The console's form handling over real HTTP on loopback (no browser: each request is written by
 * hand, as a hostile client would): the body limit, the strings of every field, and which answer an
 * invalid form gets. Whatever is refused changes nothing in the database.
 */

interface Answer {
  readonly status: number
  readonly location: string | undefined
  readonly connection: string | undefined
  readonly body: string
}

const form = (fields: Record<string, string>) => new URLSearchParams(fields).toString()

// The text of the console's message page (the notice a refusal is shown with).
const message = (html: string) => /data-testid="(?:error|auth-error)">([^<]*)</.exec(html)?.[1] ?? ""

describe("console forms (SQLite file)", { timeout: 60_000 }, () => {
  const db = sqliteFile()
  let s: Running
  let port: number
  let cookie: string
  let csrf: string

  const send = (path: string, body: string | undefined, headers: Record<string, string | number> = {}, method = "POST") =>
    new Promise<Answer>((resolve, reject) => {
      const req = request({ host: "127.0.0.1", port, method, path, headers: { cookie, ...(body !== undefined ? { "content-type": "application/x-www-form-urlencoded", "content-length": Buffer.byteLength(body) } : {}), ...headers } }, (res) => {
        let text = ""
        res.setEncoding("utf8")
        res.on("data", (c) => (text += c))
        res.on("end", () => resolve({ status: res.statusCode ?? 0, location: res.headers.location, connection: res.headers.connection, body: text }))
      })
      req.on("error", reject)
      req.end(body)
    })

  const act = (action: string, body: string) => send(`/console/actions/${action}`, body)

  // What an action could change: the audit log, the sources' controls and the target.
  const snapshot = async () => ({
    audit: (await s.admin("GET", "/v1/admin/audit?limit=500")).body,
    sources: (await s.admin("GET", "/v1/admin/sources")).body,
    target: (await s.admin("GET", "/v1/admin/targets/inspect?source=github&identity=acme%2Fapp")).body
  })

  beforeAll(async () => {
    s = await start({ storeLayer: Database.layer(db.url) })
    port = Number(new URL(s.url).port)
    const login = await fetch(`${s.url}/?token=${adminToken}`, { redirect: "manual" })
    cookie = /scanfleet_admin=[^;]+/.exec(login.headers.get("set-cookie") ?? "")?.[0] ?? ""
    expect(cookie).not.toBe("")
    const page = await send("/console/sources", undefined, {}, "GET")
    expect(page.status).toBe(200)
    csrf = /name="csrf" value="([0-9a-f]+)"/.exec(page.body)?.[1] ?? ""
    expect(csrf).not.toBe("")
    expect((await s.admin("POST", "/v1/admin/targets", { targets: [{ source: "github", identity: "acme/app" }], reason: "seed" })).status).toBe(201)
  })
  afterAll(async () => {
    await s?.close()
    db.cleanup()
  })

  it("a valid form still acts and answers 303 back to its page with done=", async () => {
    const r = await act("pause", form({ csrf, back: "/console/sources", source: "gitlab", reason: "rate limited" }))
    expect(r.status).toBe(303)
    expect(r.location).toBe("/console/sources?done=paused+gitlab")
    const back = await act("resume", form({ csrf, back: "/console/sources", source: "gitlab", reason: "quota back" }))
    expect(back.location).toBe("/console/sources?done=resumed+gitlab")
    expect((await s.admin("GET", "/v1/admin/audit?limit=2")).body.entries.map((e: any) => [e.action, e.who, e.why])).toEqual([
      ["resume_source", "dashboard", "quota back"],
      ["pause_source", "dashboard", "rate limited"]
    ])
  })

  it(`a form body over ${Console.maxFormBytes} bytes is answered 413 once the limit is crossed, before the body ends, chunked or declared, and the connection is closed`, async () => {
    const before = await snapshot()
    const head = `${form({ csrf, back: "/console/sources", source: "github", reason: "x" })}&identity=`
    for (const headers of [{ "transfer-encoding": "chunked" }, { "content-length": 20 * 1024 * 1024 }] as Array<Record<string, string | number>>) {
      // The body is never finished: only an answer given once the limit is crossed arrives at all.
      const r = await sendPast(s.url, { path: "/console/actions/requeue", headers: { cookie, "content-type": "application/x-www-form-urlencoded", ...headers }, head, fill: "i", limit: Console.maxFormBytes })
      expect(r.status, JSON.stringify(headers)).toBe(413)
      expect(r.headers.connection).toBe("close")
      expect(r.headers.location).toBeUndefined()
      expect(message(r.body)).toContain(`${Console.maxFormBytes} bytes`)
    }
    // One byte past the limit, declared and sent whole: refused too.
    const over = `${head}${"i".repeat(Console.maxFormBytes - head.length + 1)}`
    expect((await act("requeue", over)).status).toBe(413)
    expect(await snapshot()).toEqual(before)
  })

  it("the largest form a page sends fits the limit: the longest identity and reason, every character multi-byte, returning to the target's page", async () => {
    const identity = "\u00e9".repeat(512) // 1024 UTF-8 bytes, the most the store keeps
    expect((await s.admin("POST", "/v1/admin/targets", { targets: [{ source: "huggingface", identity }], reason: "seed" })).status).toBe(201)
    const back = `/console/target?${new URLSearchParams({ source: "huggingface", identity })}`
    const page = await send(back, undefined, {}, "GET")
    expect(page.status).toBe(200)
    const body = form({ csrf, back, source: "huggingface", identity, priority: "5", reason: "\u4e2d".repeat(500) })
    expect(Buffer.byteLength(body)).toBeLessThan(Console.maxFormBytes)
    const r = await act("priority", body)
    expect(r.status).toBe(303)
    expect(r.location!.startsWith(`${back}&done=`)).toBe(true)
    expect((await send(r.location!, undefined, {}, "GET")).status).toBe(200)
  })

  it("nothing unbounded is echoed into Location: a refusal naming the longest identity is shortened", async () => {
    const identity = "i".repeat(1024)
    const r = await act("requeue", form({ csrf, back: "/console/targets", source: "github", identity, reason: "x" }))
    expect(r.status).toBe(303)
    const refused = new URL(r.location ?? "", s.url).searchParams.get("refused") ?? ""
    expect(refused.startsWith("target github:iii")).toBe(true)
    expect(refused.length).toBeLessThanOrEqual(200)
    expect(r.location!.length).toBeLessThan(1024)
    // The page it redirects to shows it.
    const shown = await send(r.location!, undefined, {}, "GET")
    expect(shown.status).toBe(200)
  })

  it("a NUL in any field (or key) with a valid CSRF token is 400 naming the field, and nothing is stored", async () => {
    const before = await snapshot()
    const cases: Array<[string, string, string]> = [
      ["pause", `csrf=${csrf}&back=%2Fconsole%2Fsources&source=github&reason=%00`, "reason"],
      ["pause", `csrf=${csrf}&back=%2Fconsole%2Fsources&source=github&reason=a%00b`, "reason"],
      ["requeue", `csrf=${csrf}&back=%2Fconsole%2Fsources&source=github&identity=acme%2Fapp%00&reason=x`, "identity"],
      ["pause", `csrf=${csrf}&back=%2Fconsole%2Fsources%00&source=github&reason=x`, "back"],
      ["pause", `csrf=${csrf}&back=%2Fconsole%2Fsources&source=github&reason=x&a%00=1`, "a"],
      // bytes that are not UTF-8 (a lone surrogate's encoding, a cut sequence): refused, not rewritten to U+FFFD
      ["pause", `csrf=${csrf}&back=%2Fconsole%2Fsources&source=github&reason=a%ED%A0%80b`, "reason"],
      ["pause", `csrf=${csrf}&back=%2Fconsole%2Fsources&source=github&reason=a%C3`, "reason"]
    ]
    for (const [action, body, field] of cases) {
      const r = await act(action, body)
      expect(r.status, body).toBe(400)
      expect(r.location, body).toBeUndefined()
      expect(message(r.body), body).toContain(`${field}`)
      expect(message(r.body), body).toMatch(/NUL|invalid|UTF-8/)
    }
    expect(await snapshot()).toEqual(before)
  })

  it("with a valid CSRF token an invalid field is 400 naming it, never a CSRF failure; a missing or wrong token stays 403", async () => {
    const before = await snapshot()
    const ok = { csrf, back: "/console/sources", source: "github", reason: "x" }
    const cases: Array<[string, Record<string, string>, string]> = [
      ["pause", { ...ok, source: "nope" }, "source"],
      ["pause", { ...ok, reason: "" }, "reason"],
      ["pause", { ...ok, reason: "   " }, "reason"],
      ["pause", { ...ok, reason: "r".repeat(600) }, "reason"],
      ["pause", { ...ok, back: "https://evil.example/" }, "back"],
      ["pause", { ...ok, back: "//evil.example/" }, "back"],
      ["pause", { ...ok, back: "/\\evil.example/" }, "back"],
      ["pause", { ...ok, back: "/console/sources\r\nX-Injected: 1" }, "back"],
      ["pause", { ...ok, back: "/console/sources?x=\u4e2d" }, "back"],
      // pages that show no notice: the action would run and its answer be an error page
      ["pause", { ...ok, back: "/console/charts" }, "back"],
      ["pause", { ...ok, back: "/console/nosuch" }, "back"],
      ["pause", { csrf, back: "/console/sources", reason: "x" }, "source"],
      ["requeue", { ...ok, identity: "i".repeat(1025) }, "identity"],
      ["requeue", { ...ok, identity: "" }, "identity"],
      ["requeue", { ...ok }, "identity"],
      ["priority", { ...ok, identity: "acme/app", priority: "abc" }, "priority"],
      ["cancel", { ...ok, reservationId: "abc" }, "reservationId"],
      ["cancel", { ...ok, reservationId: "99999999999999999999" }, "reservationId"],
      ["pause", { ...ok, extra: "1" }, "extra"]
    ]
    for (const [action, fields, field] of cases) {
      const r = await act(action, form(fields))
      const what = `${action} ${JSON.stringify(fields).slice(0, 200)}`
      expect(r.status, what).toBe(400)
      expect(r.location, what).toBeUndefined()
      expect(message(r.body), what).toContain(`${field}:`)
      expect(message(r.body), what).not.toContain("CSRF")
    }
    // A repeated field is not read as one of its values.
    expect((await act("pause", `${form(ok)}&reason=y`)).status).toBe(400)
    // Without the session's token the form is refused as before, whatever else it holds.
    for (const body of [form({ ...ok, csrf: "forged" }), form({ back: ok.back, source: ok.source, reason: ok.reason }), form({ ...ok, csrf: "forged", source: "nope" }), `${form(ok)}&csrf=zz`, `csrf=${csrf}%00&back=%2Fconsole%2Fsources&source=github&reason=x`]) {
      const r = await act("pause", body)
      expect(r.status, body).toBe(403)
      expect(message(r.body)).toContain("CSRF")
    }
    expect(await snapshot()).toEqual(before)
  })

  it("a notice given in a link is shown cut to 200 characters, as the redirect cuts it", async () => {
    const long = "x".repeat(1000)
    const r = await send(`/console/sources?done=${long}`, undefined, {}, "GET")
    expect(r.status).toBe(200)
    const shown = /data-testid="notice-done"[^>]*>([^<]*)</.exec(r.body)?.[1] ?? /x{10,}…?/.exec(r.body)?.[0] ?? ""
    expect(shown.length).toBeLessThanOrEqual(200)
    expect(r.body).not.toContain("x".repeat(201))
  })

  it("a long identity of emoji is cut in the target page's title and heading without splitting a character", async () => {
    const identity = `a${"\u{1F600}".repeat(255)}`
    expect((await s.admin("POST", "/v1/admin/targets", { targets: [{ source: "gitlab", identity }], reason: "seed" })).status).toBe(201)
    const r = await send(`/console/target?${new URLSearchParams({ source: "gitlab", identity })}`, undefined, {}, "GET")
    expect(r.status).toBe(200)
    const title = /<title>([^<]*)<\/title>/.exec(r.body)?.[1] ?? ""
    expect(title).toContain("gitlab:a\u{1F600}")
    expect(title.endsWith("\u2026")).toBe(true)
    expect(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]|\ufffd/.test(r.body)).toBe(false)
  })

  it("the target search's next page keeps every filter and the page size", async () => {
    for (let i = 0; i < 3; i++) expect((await s.admin("POST", "/v1/admin/targets", { targets: [{ source: "huggingface", identity: `page/${i}` }], reason: "seed" })).status).toBe(201)
    const r = await send("/console/targets?source=huggingface&prefix=page%2F&changedSince=2000-01-01&limit=1", undefined, {}, "GET")
    expect(r.status).toBe(200)
    const next = /href="(\/console\/targets\?[^"]*after=[^"]*)"/.exec(r.body)?.[1]?.replaceAll("&amp;", "&") ?? ""
    const q = new URL(next, s.url).searchParams
    expect([q.get("source"), q.get("prefix"), q.get("changedSince"), q.get("limit")]).toEqual(["huggingface", "page/", "2000-01-01", "1"])
  })

  it("the sign-in form: without a session / answers 401 with a form posting the token in the body (no refresh); a wrong or repeated token is 401, the right one sets the session and redirects to /", async () => {
    const signedOut = await fetch(`${s.url}/`)
    expect(signedOut.status).toBe(401)
    const html = await signedOut.text()
    expect(html).toMatch(/<form method="post" action="\/login"[^>]*>.*<input type="password" name="token"/s)
    expect(html).not.toContain('http-equiv="refresh"')
    const post = (body: string) => fetch(`${s.url}/login`, { method: "POST", redirect: "manual", headers: { "content-type": "application/x-www-form-urlencoded" }, body })
    for (const body of ["token=wrong-token-0123456789", "", `token=${adminToken}&token=${adminToken}`]) {
      const r = await post(body)
      expect(r.status, body).toBe(401)
      expect(r.headers.get("set-cookie"), body).toBeNull()
    }
    const ok = await post(new URLSearchParams({ token: adminToken }).toString())
    expect(ok.status).toBe(303)
    expect(ok.headers.get("location")).toBe("/")
    const session = /scanfleet_admin=[^;]+/.exec(ok.headers.get("set-cookie") ?? "")?.[0] ?? ""
    expect(session).toBe(cookie)
    expect(ok.headers.get("set-cookie")).toMatch(/HttpOnly/i)
    expect((await fetch(`${s.url}/`, { headers: { cookie: session } })).status).toBe(200)
    expect((await post(`token=${"t".repeat(Console.maxFormBytes)}`)).status).toBe(413)
  })

  it("every answer, HTML or JSON, carries X-Content-Type-Options: nosniff", async () => {
    for (const [path, token] of [["/v1/admin/summary", adminToken], ["/v1/admin/findings?limit=1", adminToken], ["/no/such/route", null], ["/v1/admin/summary", null]] as const) {
      const r = await fetch(s.url + path, { headers: token ? { authorization: `Bearer ${token}` } : {} })
      expect(r.headers.get("x-content-type-options"), path).toBe("nosniff")
    }
  })
})
