import { connect, type Socket } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Request from "../src/internal/Request.js"
import * as Server from "../src/Server.js"
import { liveReservation, type Running, start } from "./fixtures/Harness.js"

// What one client can make the server hold: request bodies count against one budget of the
// server (`maxBodyBytesInFlight`), a device's upload is checked for ownership before a byte of
// its body is read, and a connection that never completes its headers is closed at the
// headers timeout, checked every second.

const MiB = 1024 * 1024
const budget = 2 * MiB

/** Opens a connection, sends `head` and `bytes` bytes of a body, and keeps it open. */
const stall = (url: string, head: string, bytes: number) =>
  new Promise<{ socket: Socket; answer: () => string; closed: () => boolean }>((resolve, reject) => {
    const { hostname, port } = new URL(url)
    const socket = connect(Number(port), hostname)
    let text = ""
    let closed = false
    socket.setEncoding("latin1")
    socket.on("data", (c: string) => (text += c))
    socket.on("close", () => (closed = true))
    socket.on("error", () => (closed = true))
    socket.once("connect", () => socket.write(head + "x".repeat(bytes), () => resolve({ socket, answer: () => text, closed: () => closed })))
    socket.once("error", reject)
  })

const until = async (what: string, ok: () => boolean, ms = 10_000) => {
  const end = Date.now() + ms
  while (!ok()) {
    if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}`)
    await new Promise((r) => setTimeout(r, 25))
  }
}

describe("request bodies the server holds", () => {
  let s: Running
  let edge: Awaited<ReturnType<typeof liveReservation>>
  const resultHead = (reservationId: number, token: string, length: number) =>
    `POST /v1/assignments/${reservationId}/result HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${token}\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n`

  beforeAll(async () => {
    s = await start({ settings: { maxBodyBytesInFlight: budget } })
    edge = await liveReservation(s)
  }, 60_000)
  afterAll(async () => s?.close())

  it("stalled uploads hold at most maxBodyBytesInFlight in all: the one that would pass it is answered 503 server_busy with Retry-After and closed, and what they held is freed when they go", async () => {
    const { reservationId } = edge.live
    const held = [await stall(s.url, resultHead(reservationId, edge.token, MiB), 900 * 1024), await stall(s.url, resultHead(reservationId, edge.token, MiB), 900 * 1024)]
    await until("two stalled bodies held", () => Request.bodyBytesHeld() === 2 * 900 * 1024)
    const third = await stall(s.url, resultHead(reservationId, edge.token, MiB), 300 * 1024)
    await until("the third upload answered", () => third.answer().includes("\r\n\r\n") && third.closed())
    expect(third.answer()).toMatch(/^HTTP\/1\.1 503 /)
    expect(third.answer()).toMatch(/\r\nretry-after: 1\r\n/i)
    expect(third.answer()).toContain('"error":"server_busy"')
    expect(Request.bodyBytesHeld()).toBeLessThanOrEqual(budget)
    for (const h of held) h.socket.destroy()
    await until("the stalled bodies freed", () => Request.bodyBytesHeld() === 0)
    // and a whole result goes through again
    const ok = await s.device(edge.token, "POST", `/v1/assignments/${reservationId}/result`, { fence: edge.live.fence, outcome: "clean", finalPhase: null, findings: [], log: "x".repeat(60_000) })
    expect(ok.status, JSON.stringify(ok.body)).toBe(200)
  }, 60_000)

  it("an upload to a reservation that is not the caller's, or does not exist, is answered before any of its body is read, and holds nothing", async () => {
    const other = await s.addDevice("other", 1)
    for (const [reservationId, status] of [[edge.live.reservationId, 403], [999_999, 404]] as const) {
      for (const path of ["result", "progress", "release"]) {
        const c = await stall(s.url, resultHead(reservationId, other.token, MiB).replace("/result ", `/${path} `), 0)
        await until(`the ${path} upload answered`, () => c.answer().includes("\r\n\r\n"))
        expect(c.answer(), path).toMatch(new RegExp(`^HTTP/1\\.1 ${status} `))
        expect(Request.bodyBytesHeld()).toBe(0)
        c.socket.destroy()
      }
    }
  }, 60_000)

  it(`a connection that never completes its headers is closed within ${Server.listenerOptions.headersTimeout / 1000} s (plus the one-second check), not the request timeout's ${Server.listenerOptions.requestTimeout / 1000} s`, async () => {
    const c = await stall(s.url, "POST /v1/assignments/claim HTTP/1.1\r\nHost: 127.0.0.1\r\n", 0)
    const began = Date.now()
    await until("the silent connection closed", c.closed, Server.listenerOptions.headersTimeout + 10_000)
    expect(Date.now() - began).toBeLessThan(Server.listenerOptions.requestTimeout)
    expect(c.answer()).toMatch(/^HTTP\/1\.1 408 /)
  }, 90_000)
})
