import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import type { AddressInfo, Socket } from "node:net"
import { FindingStore, type Findings, Operations } from "@scanfleet/core"
import { Effect, Layer, ManagedRuntime } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import * as Database from "../src/Database.js"
import * as ServerMod from "../src/Server.js"
import * as ServerConfig from "../src/ServerConfig.js"
import * as Webhooks from "../src/Webhooks.js"
import { sqliteFile } from "./fixtures/Databases.js"
import { adminToken, call } from "./fixtures/Harness.js"
import { scan } from "./fixtures/Scans.js"

const secret = "webhook-signing-secret-0123456789"
const db = sqliteFile()
afterAll(() => db.cleanup())

interface Received {
  readonly seq: number
  readonly identity: string
  readonly verified: boolean
}

/** A loopback receiver whose behaviour the test changes while events flow. */
const receiver = async () => {
  const received: Array<Received> = []
  let mode: "ok" | "fail" | "hang" = "ok"
  let failNext = 0
  let hangNext = 0
  const poison = new Set<string>(["poison/one"])
  const sockets = new Set<Socket>()
  const handler = (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8")
      const e = JSON.parse(body) as Findings.OutboxEvent
      if (hangNext > 0) {
        hangNext--
        return // never answered: the sender's timeout fires
      }
      if (failNext > 0 || mode === "fail" || poison.has(e.scan.identity)) {
        failNext = Math.max(0, failNext - 1)
        res.writeHead(500).end("not now")
        return
      }
      received.push({ seq: Number(req.headers[Webhooks.eventHeader]), identity: e.scan.identity, verified: Webhooks.verify(secret, body, req.headers[Webhooks.signatureHeader] as string, Date.now()) })
      res.writeHead(204).end()
    })
  }
  let server: Server = createServer(handler)
  const track = (s: Server) => s.on("connection", (c: Socket) => (sockets.add(c), c.on("close", () => sockets.delete(c))))
  track(server)
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
  const port = (server.address() as AddressInfo).port
  return {
    url: `http://127.0.0.1:${port}/hook`,
    received,
    poison,
    set: (m: typeof mode) => void (mode = m),
    failTimes: (n: number) => void (failNext = n),
    hangTimes: (n: number) => void (hangNext = n),
    /** Stops listening (connections refused) and comes back on the same port after `ms`. */
    disappear: async (ms: number) => {
      for (const c of sockets) c.destroy()
      await new Promise<void>((r) => server.close(() => r()))
      await new Promise((r) => setTimeout(r, ms))
      server = createServer(handler)
      track(server)
      await new Promise<void>((r) => server.listen(port, "127.0.0.1", r))
    },
    close: () => new Promise<void>((r) => (sockets.forEach((c) => c.destroy()), server.close(() => r())))
  }
}

const until = async (what: string, ok: () => boolean | Promise<boolean>, ms = 30_000) => {
  const end = Date.now() + ms
  while (!(await ok())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 25))
  }
}

describe("findings webhooks", () => {
  it("a receiver that fails, times out and disappears for a while: every event arrives at least once, in order per target, signatures verify, and the dead-letter list holds what exhausted its tries until it is redelivered", async () => {
    const rx = await receiver()
    const config = ServerConfig.make({
      adminToken, host: "127.0.0.1", port: 0, logLevel: "none", databaseUrl: db.url,
      webhookUrl: rx.url, webhookSecret: secret, webhookMaxTries: 8, webhookTimeoutMs: 300, webhookBaseDelayMs: 50, webhookMaxDelayMs: 400, webhookPollMs: 20
    })
    const rt = ManagedRuntime.make(ServerMod.layer(config).pipe(Layer.provideMerge(Database.layer(db.url))))
    try {
      const url = (await rt.runPromise(ServerMod.Info)).url
      const t0 = Date.now()
      rx.failTimes(2)
      rx.hangTimes(1)
      await rt.runPromise(scan("repo/a", ["a1", "a2"], t0))
      await rt.runPromise(scan("repo/b", ["b1"], t0 + 1))
      await rt.runPromise(scan("poison/one", ["p1"], t0 + 2))
      await until("the first deliveries", () => rx.received.length >= 1)
      const gone = rx.disappear(1200)
      await rt.runPromise(scan("repo/a", ["a2", "a3"], t0 + 10_000))
      await rt.runPromise(scan("repo/b", [], t0 + 10_001))
      await rt.runPromise(scan("repo/a", ["a3"], t0 + 20_000))
      await gone
      await rt.runPromise(scan("repo/c", ["c1"], t0 + 20_001))
      const all = await rt.runPromise(Effect.flatMap(FindingStore.FindingStore, (f) => f.outbox(0, 100)))
      expect(all.length).toBe(7)
      const expected = all.filter((e) => e.scan.identity !== "poison/one").map((e) => e.seq)
      await until("every deliverable event", () => expected.every((seq) => rx.received.some((r) => r.seq === seq)))
      expect(rx.received.every((r) => r.verified)).toBe(true)
      for (const identity of ["repo/a", "repo/b", "repo/c"]) {
        const firsts = [...new Set(rx.received.filter((r) => r.identity === identity).map((r) => r.seq))]
        expect(firsts).toEqual(all.filter((e) => e.scan.identity === identity).map((e) => e.seq))
      }
      const poisonSeq = all.find((e) => e.scan.identity === "poison/one")!.seq
      await until("the dead letter", async () => (await call(`${url}/v1/admin/findings/webhook/dead-letters`, adminToken, "GET")).body.deadLetters?.length === 1)
      const dl = await call(`${url}/v1/admin/findings/webhook/dead-letters`, adminToken, "GET")
      expect(dl.body.deadLetters).toEqual([expect.objectContaining({ seq: poisonSeq, attempts: 8, lastError: "HTTP 500" })])
      expect(rx.received.some((r) => r.identity === "poison/one")).toBe(false)
      // the receiver is fixed; an operator redelivers
      rx.poison.clear()
      const re = await call(`${url}/v1/admin/findings/webhook/dead-letters/${poisonSeq}/redeliver`, adminToken, "POST")
      expect(re.status).toBe(202)
      await until("the redelivered event", () => rx.received.some((r) => r.seq === poisonSeq))
      // the letter leaves the list once its delivery succeeded
      await until("the empty dead-letter list", async () => (await call(`${url}/v1/admin/findings/webhook/dead-letters`, adminToken, "GET")).body.deadLetters?.length === 0)
      expect((await call(`${url}/v1/admin/findings/webhook/dead-letters/${poisonSeq}/redeliver`, adminToken, "POST")).status).toBe(404)
    } finally {
      await rt.dispose()
      await rx.close()
    }
  }, 60_000)

  it("two server instances on one database deliver each event once, through the instance holding the webhook lease; when it stops, the other takes over from the stored position", async () => {
    const shared = sqliteFile()
    const rx = await receiver()
    const config = ServerConfig.make({
      adminToken, host: "127.0.0.1", port: 0, logLevel: "none", databaseUrl: shared.url,
      webhookUrl: rx.url, webhookSecret: secret, webhookMaxTries: 8, webhookTimeoutMs: 10_000, webhookBaseDelayMs: 50, webhookMaxDelayMs: 400, webhookPollMs: 20
    })
    const a = ManagedRuntime.make(ServerMod.layer(config).pipe(Layer.provideMerge(Database.layer(shared.url))))
    const b = ManagedRuntime.make(ServerMod.layer(config).pipe(Layer.provideMerge(Database.layer(shared.url))))
    try {
      // a starts first and takes the lease; b finds it held
      await a.runPromise(ServerMod.Info)
      await b.runPromise(ServerMod.Info)
      const t0 = Date.now()
      for (let i = 0; i < 6; i++) await (i % 2 === 0 ? a : b).runPromise(scan(`two/${i}`, [`s${i}`], t0 + i))
      const first = await a.runPromise(Effect.flatMap(FindingStore.FindingStore, (f) => f.outbox(0, 100)))
      expect(first.length).toBe(6)
      await until("the first six events", () => first.every((e) => rx.received.some((r) => r.seq === e.seq)))
      // give a second deliverer time to post its copies, had there been one
      await new Promise((r) => setTimeout(r, 500))
      expect(rx.received.map((r) => r.seq)).toEqual(first.map((e) => e.seq))
      // the holder has stored its position past the last of them, then stops (its lease released): the other instance delivers what comes next
      const last = first[first.length - 1].seq
      await until("the stored position", async () => (await a.runPromise(Effect.flatMap(FindingStore.FindingStore, (f) => f.cursor(Webhooks.subscriber)))) === last)
      const leaseHeld = (await a.runPromise(Effect.flatMap(Operations.Operations, (o) => o.acquireLease(Webhooks.leaseName, "probe", 1, Date.now())))) === null
      expect(leaseHeld).toBe(true)
      await a.dispose()
      for (let i = 6; i < 9; i++) await b.runPromise(scan(`two/${i}`, [`s${i}`], t0 + i))
      const all = await b.runPromise(Effect.flatMap(FindingStore.FindingStore, (f) => f.outbox(0, 100)))
      await until("every event after the takeover", () => all.every((e) => rx.received.some((r) => r.seq === e.seq)), Webhooks.leaseMs + 15_000)
      await new Promise((r) => setTimeout(r, 500))
      expect(rx.received.map((r) => r.seq)).toEqual(all.map((e) => e.seq))
      expect(await b.runPromise(Effect.flatMap(FindingStore.FindingStore, (f) => f.deadLetters(Webhooks.subscriber)))).toEqual([])
    } finally {
      await a.dispose()
      await b.dispose()
      await rx.close()
      shared.cleanup()
    }
  }, 60_000)

  it("the answer is the status alone: a redirect is a failure that is never followed, and a 2xx with an endless body counts at once", async () => {
    const local = sqliteFile()
    // Where a redirect points: it must never be asked anything.
    const elsewhere: Array<string> = []
    const other = createServer((req, res) => (elsewhere.push(`${req.method} ${req.url}`), res.writeHead(200).end()))
    await new Promise<void>((r) => other.listen(0, "127.0.0.1", r))
    let mode: "redirect" | "endless" = "redirect"
    const got: Array<number> = []
    const sockets = new Set<Socket>()
    const hook = createServer((req, res) => {
      req.resume()
      req.on("end", () => {
        if (mode === "redirect") return res.writeHead(307, { location: `http://127.0.0.1:${(other.address() as AddressInfo).port}/elsewhere` }).end()
        got.push(Number(req.headers[Webhooks.eventHeader]))
        // 200, then a body that never ends: the sender has its answer from the status
        res.writeHead(200, { "content-type": "application/octet-stream" })
        const chunk = Buffer.alloc(64 * 1024, 120)
        const timer = setInterval(() => res.write(chunk), 5)
        res.on("close", () => clearInterval(timer))
      })
    })
    hook.on("connection", (c: Socket) => (sockets.add(c), c.on("close", () => sockets.delete(c))))
    await new Promise<void>((r) => hook.listen(0, "127.0.0.1", r))
    const config = ServerConfig.make({
      adminToken, host: "127.0.0.1", port: 0, logLevel: "none", databaseUrl: local.url,
      webhookUrl: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/hook`, webhookSecret: secret,
      webhookMaxTries: 2, webhookTimeoutMs: 3000, webhookBaseDelayMs: 20, webhookMaxDelayMs: 40, webhookPollMs: 20
    })
    const rt = ManagedRuntime.make(ServerMod.layer(config).pipe(Layer.provideMerge(Database.layer(local.url))))
    const store = <A>(f: (s: FindingStore.FindingStoreShape) => Effect.Effect<A, unknown>) => rt.runPromise(Effect.flatMap(FindingStore.FindingStore, f))
    try {
      await rt.runPromise(ServerMod.Info)
      const t0 = Date.now()
      await rt.runPromise(scan("redirected/one", ["r1"], t0))
      await until("the redirected event's dead letter", async () => (await store((f) => f.deadLetters(Webhooks.subscriber))).length === 1)
      expect((await store((f) => f.deadLetters(Webhooks.subscriber)))[0]).toMatchObject({ attempts: 2, lastError: "HTTP 307: a redirect, which is not followed" })
      expect(elsewhere).toEqual([])
      mode = "endless"
      await rt.runPromise(scan("endless/two", ["e1"], t0 + 1))
      const [, second] = await store((f) => f.outbox(0, 10))
      const started = Date.now()
      await until("the position past the second event", async () => (await store((f) => f.cursor(Webhooks.subscriber))) >= second.seq, 20_000)
      // counted from its status, well within the timeout, and once
      expect(Date.now() - started).toBeLessThan(3000)
      expect(got).toEqual([second.seq])
      expect(await store((f) => f.deadLetters(Webhooks.subscriber))).toHaveLength(1)
    } finally {
      await rt.dispose()
      sockets.forEach((c) => c.destroy())
      await new Promise<void>((r) => hook.close(() => r()))
      await new Promise<void>((r) => other.close(() => r()))
      local.cleanup()
    }
  }, 60_000)

  it("a redelivery under way when the server stops loses nothing: the letter stays listed until its event is delivered", async () => {
    const local = sqliteFile()
    const rx = await receiver()
    rx.set("fail")
    const config = ServerConfig.make({
      adminToken, host: "127.0.0.1", port: 0, logLevel: "none", databaseUrl: local.url,
      webhookUrl: rx.url, webhookSecret: secret, webhookMaxTries: 2, webhookTimeoutMs: 5000, webhookBaseDelayMs: 20, webhookMaxDelayMs: 40, webhookPollMs: 20
    })
    const start = () => ManagedRuntime.make(ServerMod.layer(config).pipe(Layer.provideMerge(Database.layer(local.url))))
    let rt = start()
    try {
      let url = (await rt.runPromise(ServerMod.Info)).url
      await rt.runPromise(scan("redeliver/one", ["x1"], Date.now()))
      const letters = async () => (await call(`${url}/v1/admin/findings/webhook/dead-letters`, adminToken, "GET")).body.deadLetters as Array<{ seq: number }>
      await until("the dead letter", async () => (await letters()).length === 1)
      const [{ seq }] = await letters()
      // The receiver now hangs: the redelivery is in flight when the server stops.
      rx.set("ok")
      rx.hangTimes(1)
      expect((await call(`${url}/v1/admin/findings/webhook/dead-letters/${seq}/redeliver`, adminToken, "POST")).status).toBe(202)
      await new Promise((r) => setTimeout(r, 300))
      await rt.dispose()
      rt = start()
      url = (await rt.runPromise(ServerMod.Info)).url
      expect((await letters()).map((l) => l.seq)).toEqual([seq])
      expect((await call(`${url}/v1/admin/findings/webhook/dead-letters/${seq}/redeliver`, adminToken, "POST")).status).toBe(202)
      await until("the redelivered event", () => rx.received.some((r) => r.seq === seq))
      await until("the empty dead-letter list", async () => (await letters()).length === 0)
    } finally {
      await rt.dispose()
      await rx.close()
      local.cleanup()
    }
  }, 60_000)

  it("a webhook URL must be http or https, without a user name or password, and the refusal never repeats it", () => {
    expect(Webhooks.urlProblem("https://hooks.example.com/scanfleet")).toBeUndefined()
    expect(Webhooks.urlProblem("http://127.0.0.1:9000/hook")).toBeUndefined()
    for (const bad of ["file:///etc/passwd", "ftp://host/x", "javascript:alert(1)", "data:text/plain,hi", "hooks.example.com/x", "http://hookuser:PLANTEDPW-4242@127.0.0.1:9000/hook", "https://token@hooks.example.com/"]) {
      const why = Webhooks.urlProblem(bad)
      expect(why, bad).toBeDefined()
      expect(why).not.toContain("PLANTEDPW")
      expect(why).not.toContain("token@")
      // The server's settings refuse it at start, naming where it was set and not the URL.
      const refused = (() => {
        try {
          ServerConfig.load({ env: { SCANFLEET_ADMIN_TOKEN: adminToken, SCANFLEET_WEBHOOK_URL: bad, SCANFLEET_WEBHOOK_SECRET: secret } })
          return null
        } catch (e) {
          return e as Error
        }
      })()
      expect(refused, bad).toBeInstanceOf(ServerConfig.ServerConfigError)
      expect(refused!.message).toContain("webhookUrl (SCANFLEET_WEBHOOK_URL)")
      expect(refused!.message).not.toContain("PLANTEDPW")
    }
  })

  it("a signature verifies only with the secret, over the exact body, within the tolerance", () => {
    const now = Date.now()
    const h = Webhooks.sign(secret, '{"a":1}', now)
    expect(Webhooks.verify(secret, '{"a":1}', h, now)).toBe(true)
    expect(Webhooks.verify("another-secret-0123456789", '{"a":1}', h, now)).toBe(false)
    expect(Webhooks.verify(secret, '{"a":2}', h, now)).toBe(false)
    expect(Webhooks.verify(secret, '{"a":1}', h, now + 10 * 60_000)).toBe(false)
    expect(Webhooks.verify(secret, '{"a":1}', undefined, now)).toBe(false)
  })
})
