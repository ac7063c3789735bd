/**
 * Workload 8: through the Worker API over HTTP. The server-example runs as its
 * own process on PostgreSQL; 32 simulated devices (one slot each) each loop:
 * claim, 10 progress requests of one event each, result (whose answer is the
 * receipt). Reported: assignments per second and latency per endpoint.
 */
import { spawn, type ChildProcess } from "node:child_process"
import { Agent, request } from "node:http"
import { createServer } from "node:net"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { chunks, loops, since, size, type Ctx } from "../Context.js"
import { measure, meter, median, type Sample, type SystemResult, type WorkloadResult } from "../Report.js"
import * as Scanfleet from "../Scanfleet.js"

const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const srv = createServer()
    srv.on("error", reject)
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address()
      srv.close(() => resolve(typeof addr === "object" && addr ? addr.port : 0))
    })
  })

const agent = new Agent({ keepAlive: true, maxSockets: 256 })

const call = (port: number, method: string, path: string, token: string, body?: unknown) =>
  new Promise<{ status: number; json: any }>((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body))
    const req = request(
      { host: "127.0.0.1", port, method, path, agent, headers: { authorization: `Bearer ${token}`, ...(data ? { "content-type": "application/json", "content-length": data.length } : {}) } },
      (res) => {
        const parts: Array<Buffer> = []
        res.on("data", (c) => parts.push(c))
        res.on("end", () => {
          const text = Buffer.concat(parts).toString("utf8")
          try {
            resolve({ status: res.statusCode ?? 0, json: text ? JSON.parse(text) : null })
          } catch {
            resolve({ status: res.statusCode ?? 0, json: text })
          }
        })
      }
    )
    req.on("error", reject)
    if (data) req.write(data)
    req.end()
  })

const phases = ["assigned", "permit_wait", "preparing", "acquiring", "scanning", "filtering", "cleanup", "staging", "bundling", "uploading"] as const

const pct = (xs: Array<number>, p: number) => {
  if (xs.length === 0) return NaN
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.ceil(p * s.length) - 1)]
}

const run = async (ctx: Ctx, devices: number, seconds: number, backlog: number): Promise<Sample> => {
  const db = await ctx.pg.freshDb("sf_http")
  let child: ChildProcess | undefined
  try {
    // targets enter through the store, as discovery would put them there
    const sf = await Scanfleet.openPg(db.url, 2)
    const now = Date.now()
    for (const c of chunks(Array.from({ length: backlog }, (_, i) => i), 10_000))
      await sf.run((st) => st.recordObservations(c.map((i) => ({ source: "github" as const, identity: `h/${i}`, remoteAt: now - 1000 })), now))
    await sf.close()
    await ctx.pg.analyze(db.name)
    const port = await freePort()
    const admin = "bench-admin-token-0123456789abcdef"
    const serve = join(dirname(fileURLToPath(import.meta.url)), "..", "serve.mjs")
    child = spawn(process.execPath, [serve], {
      env: { ...process.env, SCANFLEET_DATABASE_URL: db.url, SCANFLEET_PORT: String(port), SCANFLEET_ADMIN_TOKEN: admin, SCANFLEET_POOL_SIZE: "20", SCANFLEET_LOG_LEVEL: "error" },
      stdio: ["ignore", "ignore", "pipe"]
    })
    let stderr = ""
    child.stderr!.on("data", (c) => (stderr = (stderr + c).slice(-4000)))
    const up = Date.now()
    for (;;) {
      try {
        const r = await call(port, "GET", "/v1/admin/targets", admin)
        if (r.status === 200) break
      } catch {}
      if (child.exitCode !== null) throw new Error(`server exited: ${stderr}`)
      if (Date.now() - up > 30_000) throw new Error(`server did not answer within 30 s: ${stderr}`)
      await new Promise((r) => setTimeout(r, 200))
    }
    const tokens: Array<string> = []
    for (let i = 0; i < devices; i++) {
      const r = await call(port, "POST", "/v1/admin/devices", admin, { name: `device-${i}`, slots: 1 })
      if (r.status >= 300) throw new Error(`device add: ${r.status} ${JSON.stringify(r.json)}`)
      tokens.push(r.json.token)
    }
    const lat: Record<string, Array<number>> = { claim: [], progress: [], result: [] }
    const timed = async (name: string, f: () => Promise<{ status: number; json: any }>) => {
      const t = performance.now()
      const r = await f()
      lat[name].push(performance.now() - t)
      if (r.status >= 300) throw new Error(`${name}: HTTP ${r.status} ${JSON.stringify(r.json).slice(0, 300)}`)
      return r.json
    }
    await ctx.pg.resetStatements()
    // the server child's CPU is not this process's: the client column is the load generator, the server column PostgreSQL
    const costs = await meter(ctx.pg)
    let assignments = 0
    const t0 = performance.now()
    const deadline = t0 + seconds * 1000
    await loops(devices, async (d) => {
      const token = tokens[d]
      while (performance.now() < deadline) {
        const c = await timed("claim", () => call(port, "POST", "/v1/assignments/claim", token, { slot: 0 }))
        const a = c.assignment
        if (!a) throw new Error("backlog ran dry")
        const at0 = Date.now()
        for (let k = 0; k < phases.length; k++)
          await timed("progress", () =>
            call(port, "POST", `/v1/assignments/${a.reservationId}/progress`, token, { fence: a.fence, events: [{ seq: k + 1, kind: "phase", phase: phases[k], at: at0 + k }] })
          )
        const receipt = await timed("result", () =>
          call(port, "POST", `/v1/assignments/${a.reservationId}/result`, token, { fence: a.fence, outcome: "clean", finalPhase: "uploading", findings: [], log: "" })
        )
        if (!receipt?.receiptId) throw new Error(`no receipt: ${JSON.stringify(receipt)}`)
        assignments++
      }
    })
    const secs = since(t0)
    const cost = await costs.end(assignments)
    const stmts = await ctx.pg.statements(db.name)
    if (process.env.BENCH_TRACE) for (const x of await ctx.pg.topStatements(db.name, 30)) ctx.log(`      ${x.calls} calls ${x.ms} ms: ${x.query}`)
    const extra: Record<string, number> = { assignments }
    for (const k of Object.keys(lat)) {
      extra[`${k} p50 ms`] = pct(lat[k], 0.5)
      extra[`${k} p99 ms`] = pct(lat[k], 0.99)
    }
    return { value: assignments / secs, statementsPerUnit: stmts / assignments, ...cost, extra, profile: await ctx.pg.profile(db.name, assignments) }
  } finally {
    if (child && child.exitCode === null) {
      child.kill("SIGTERM")
      await new Promise((r) => {
        const t = setTimeout(() => {
          child!.kill("SIGKILL")
          r(undefined)
        }, 10_000)
        child!.once("exit", () => {
          clearTimeout(t)
          r(undefined)
        })
      })
    }
    await ctx.pg.dropDb(db.name)
  }
}

const serverMissing = async (): Promise<string | null> => {
  try {
    const specifier: string = "@scanfleet/server-example"
    const m = (await import(specifier)) as Record<string, any>
    return m.Cli?.main ? null : "this build of @scanfleet/server-example has no Cli.main"
  } catch (e) {
    return `@scanfleet/server-example could not be loaded (run \`npm run build\` at the root first): ${(e as Error).message.split("\n")[0]}`
  }
}

/** Workload 8. */
export const api = async (ctx: Ctx): Promise<Array<WorkloadResult>> => {
  const devices = 32
  const seconds = size(ctx, "http.seconds", 3, 20)
  const backlog = size(ctx, "http.backlog", 5_000, 50_000)
  const missing = (await Scanfleet.pgMissing()) ?? (await serverMissing())
  if (missing) throw new Error(missing)
  const systems: Array<SystemResult> = await measure([{ name: "scanfleet server-example on PgStore", run: () => run(ctx, devices, seconds, backlog) }], ctx.runs, ctx.log)
  const s = systems[0]
  const endpoint = (k: string, path: string): SystemResult => ({
    system: path,
    errors: s.errors.length ? ["see table 8"] : [],
    samples: s.samples.map((x) => ({ value: Number(x.extra?.[`${k} p99 ms`]), extra: { "p50 ms": Number(x.extra?.[`${k} p50 ms`]) } }))
  })
  return [
    {
      id: "8",
      title: `Worker API over HTTP: ${devices} devices, each claim + 10 progress requests + result with receipt, ${seconds} s per run`,
      goal: "report assignments/s and p99 latency per endpoint",
      unit: "assignments/s",
      higherIsBetter: true,
      systems,
      notes: ["stmts/unit here is statements per assignment (12 HTTP requests)", "the server is its own process (server-example, pool 20); the 32 devices share one client process on the same 2 cores"]
    },
    {
      id: "8.latency",
      title: "Worker API over HTTP: p99 latency per endpoint (median of the runs' p99s; p50 below)",
      goal: "report",
      unit: "ms p99",
      higherIsBetter: false,
      noRatio: true,
      systems: [endpoint("claim", "POST /v1/assignments/claim"), endpoint("progress", "POST /v1/assignments/:id/progress"), endpoint("result", "POST /v1/assignments/:id/result")],
      notes: []
    }
  ]
}
void median
