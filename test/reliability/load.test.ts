import { afterAll, beforeAll, describe, expect, inject, it } from "vitest"
import { addDevice, applyConfig, storeOn } from "./support/Fleet.js"
import { violations } from "./support/Invariants.js"
import { adminToken, call, database, marked, rssKiB, type ServerProc, startServer, withPg } from "./support/Procs.js"

/**
 * Load: simulated devices (200 by default) claim, report progress, upload
 * results, release and abandon work against two server processes on one
 * PostgreSQL database for a bounded time, while both servers' resident
 * memory is sampled from /proc. The invariants hold at the end and memory
 * stays flat after warm-up (docs/reliability.md lists the figures). `SCANFLEET_LOAD_SECONDS` and
 * `SCANFLEET_LOAD_DEVICES` make the longer run of `npm run soak`.
 */

// 60 s: on an idle machine the servers' heaps are still sizing themselves for
// 200 connections for the first ~35 s; a shorter window measures warm-up, not a leak.
const seconds = Number(process.env.SCANFLEET_LOAD_SECONDS ?? 60)
const deviceCount = Number(process.env.SCANFLEET_LOAD_DEVICES ?? 200)

let db: Awaited<ReturnType<typeof database>>
let store: ReturnType<typeof storeOn>
const servers: Array<ServerProc> = []

beforeAll(async () => {
  db = await database(inject("pgUrl"))
  for (let i = 0; i < 2; i++) servers.push(await startServer({ databaseUrl: db.url, logLevel: "warning", poolSize: 10, sweepIntervalMs: 500 }))
  store = storeOn(db.url)
  await applyConfig(servers[0].url, { scan: 600, upload: 120, ttl: 900 })
}, 240_000)

afterAll(async () => {
  await store?.close()
  for (const s of servers) await s.kill("SIGTERM")
  await db?.drop()
  expect(marked()).toEqual([])
})

const phases = ["assigned", "permit_wait", "preparing", "scanning", "filtering", "cleanup", "staging", "bundling", "uploading", "awaiting_receipt"] as const
const mean = (xs: ReadonlyArray<number>) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length)

describe(`load: ${deviceCount} simulated devices against two server processes on PostgreSQL for ${seconds} s`, () => {
  it("the invariants hold (no double claim, no lost reservation, no duplicated or reordered event, one receipt per result) and the servers' memory stays flat", async () => {
    const targets = Math.max(5000, deviceCount * seconds * 3)
    for (let i = 0; i < targets; i += 5000)
      await store.seed(Array.from({ length: Math.min(5000, targets - i) }, (_, j) => `load/repo-${i + j}`))
    const devices: Array<{ id: number; token: string }> = []
    for (let i = 0; i < deviceCount; i += 20) devices.push(...(await Promise.all(Array.from({ length: Math.min(20, deviceCount - i) }, (_, j) => addDevice(servers[(i + j) % 2].url, `load-${i + j}`, 1)))))

    const samples: Array<Array<number>> = [[], []]
    const sampler = setInterval(() => servers.forEach((s, i) => samples[i].push(rssKiB(s.pid) ?? 0)), 250)
    const counts = { requests: 0, completed: 0, released: 0, abandoned: 0, idle: 0, errors: 0, latencies: [] as Array<number> }
    const end = Date.now() + seconds * 1000
    const timed = async (url: string, token: string, method: string, path: string, body?: unknown) => {
      const t = performance.now()
      const r = await call(url, method, path, { token, ...(body !== undefined ? { body } : {}) })
      counts.latencies.push(performance.now() - t)
      counts.requests++
      if (r.status >= 500) counts.errors++
      return r
    }
    await Promise.all(
      devices.map(async (d, i) => {
        let turn = i
        while (Date.now() < end) {
          const url = servers[turn++ % 2].url
          const c = await timed(url, d.token, "POST", "/v1/assignments/claim", { slot: 0 })
          expect(c.status, c.text).toBe(200)
          const a = c.body.assignment
          if (!a) {
            counts.idle++
            await new Promise((r) => setTimeout(r, 200))
            continue
          }
          const n = 2 + (i % (phases.length - 2))
          for (let seq = 1; seq <= n; seq += 3) {
            const events = phases.slice(seq - 1, Math.min(n, seq + 2)).map((phase, k) => ({ seq: seq + k, kind: "phase", phase, at: Date.now() }))
            // Every other batch goes to the other server, as a device behind a load balancer would.
            const p = await timed(servers[(turn + seq) % 2].url, d.token, "POST", `/v1/assignments/${a.reservationId}/progress`, { fence: a.fence, events })
            expect(p.status, p.text).toBe(200)
          }
          const roll = (i * 7919 + turn) % 100
          if (roll < 5) {
            const r = await timed(url, d.token, "POST", `/v1/assignments/${a.reservationId}/release`, { fence: a.fence })
            expect(r.status, r.text).toBe(200)
            counts.released++
          } else {
            const body = { fence: a.fence, outcome: roll % 3 === 0 ? "findings" : "clean", finalPhase: phases[n - 1], findings: roll % 3 === 0 ? [{ scanner: "load", detector: "r", path: "f", line: roll, fingerprint: `hmac-sha256:${"0".repeat(64)}`, preview: "" }] : [], log: "" }
            const r = await timed(url, d.token, "POST", `/v1/assignments/${a.reservationId}/result`, body)
            expect(r.status, r.text).toBe(200)
            // A retry through the other server returns the same receipt.
            if (roll % 10 === 1) {
              const again = await timed(servers[turn % 2].url, d.token, "POST", `/v1/assignments/${a.reservationId}/result`, body)
              expect(again.body.receiptId).toBe(r.body.receiptId)
            }
            counts.completed++
          }
        }
      })
    )
    clearInterval(sampler)
    expect(counts.errors).toBe(0)
    expect(await violations(db.url)).toEqual([])
    const rows = await withPg(db.url, (c) => c.query(`SELECT state, count(*)::int AS n FROM assignments GROUP BY state ORDER BY state`))
    const byState = Object.fromEntries(rows.rows.map((r) => [r.state, r.n]))
    expect(byState.completed ?? 0).toBe(counts.completed)
    expect(byState.released ?? 0).toBe(counts.released)
    const summary = await call(servers[1].url, "GET", "/v1/admin/summary", { token: adminToken })
    expect(summary.status).toBe(200)

    const lat = [...counts.latencies].sort((a, b) => a - b)
    const q = (p: number) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))].toFixed(1)
    const report: Array<string> = [
      `load: ${deviceCount} devices, 2 servers, ${seconds} s: ${counts.requests} requests (${(counts.requests / seconds).toFixed(0)}/s), ${counts.completed} results, ${counts.released} releases, ${counts.idle} empty claims, 0 errors`,
      `load: latency ms p50 ${q(0.5)} p95 ${q(0.95)} p99 ${q(0.99)}`
    ]
    for (let i = 0; i < 2; i++) {
      // Warm-up (JIT, pools, caches) is the first 40 %; then the middle and the last quarter must agree.
      const s = samples[i].filter((x) => x > 0)
      const mid = s.slice(Math.floor(s.length * 0.4), Math.floor(s.length * 0.7))
      const last = s.slice(Math.floor(s.length * 0.75))
      const growth = mean(last) - mean(mid)
      report.push(`load: server ${i + 1} RSS MiB start ${(s[0] / 1024).toFixed(0)}, after warm-up ${(mean(mid) / 1024).toFixed(0)}, end ${(mean(last) / 1024).toFixed(0)}, peak ${(Math.max(...s) / 1024).toFixed(0)}`)
      expect(growth, `server ${i + 1} grew ${(growth / 1024).toFixed(1)} MiB after warm-up`).toBeLessThan(Math.max(64 * 1024, 0.25 * mean(mid)))
    }
    console.log(report.join("\n"))
    // Throughput depends on the machine; the test asks only that work got done.
    expect(counts.completed).toBeGreaterThan(0)
  }, seconds * 1000 + 150_000)
})
