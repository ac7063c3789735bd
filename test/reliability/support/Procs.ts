import { type ChildProcess, spawn } from "node:child_process"
import { randomBytes, randomUUID } from "node:crypto"
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { createServer as createNetServer } from "node:net"
import { fileURLToPath } from "node:url"
import pg from "pg"
import { entries, standalone } from "../../../build/standalone.js"

/**
 * Real processes for the reliability suite: the scanfleet server and the
 * worker CLI, each run from source in its own Node process (so `kill -9`
 * kills exactly one of them), their output captured for the log checks; a
 * fresh PostgreSQL database per test file; /proc probes for orphans and memory.
 */

/** The repository root. */
export const root = fileURLToPath(new URL("../../../", import.meta.url))

// The server and worker CLIs are bundled from source once per test file, as the
// packages' build makes their bins (build/standalone.ts): a bundle starts in a
// fraction of the time a TypeScript loader takes. The worker's execution unit
// and demo scanner are bundled beside it, where the built package keeps them.
const buildRoot = `${root}test/reliability/.build/`
const buildDir = `${buildRoot}${process.pid}/`

const running = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM"
  }
}
let built: Promise<{ server: string; worker: string }> | null = null

/** Builds both CLIs (once per process); resolves to their paths. */
export const bundles = (): Promise<{ server: string; worker: string }> =>
  (built ??= (async () => {
    const { build } = await import("tsup")
    process.on("exit", () => rmSync(buildDir, { recursive: true, force: true }))
    // A test process that is killed rather than exiting leaves its bundles: those of processes gone are removed.
    for (const pid of existsSync(buildRoot) ? readdirSync(buildRoot) : []) if (!running(Number(pid))) rmSync(`${buildRoot}${pid}`, { recursive: true, force: true })
    mkdirSync(buildDir, { recursive: true })
    await build({
      ...standalone(
        "reliability",
        {
          server: `${root}${entries["server-example"].bin}`,
          worker: fileURLToPath(new URL("../fixtures/worker-entry.ts", import.meta.url)),
          unit: `${root}${entries.worker.unit}`,
          "demo-scanner": `${root}${entries.worker["demo-scanner"]}`
        },
        `${buildDir}bin`
      ),
      config: false,
      silent: true
    })
    return { server: `${buildDir}bin/server.js`, worker: `${buildDir}bin/worker.js` }
  })())

/** Every process this suite starts carries this mark in its environment, so /proc finds them and their descendants. */
export const MARK_VAR = "SCANFLEET_RELIABILITY_MARK"
/** This test file's mark. */
export const mark = randomUUID()

/** A child process with its output kept line by line. */
export interface Proc {
  readonly child: ChildProcess
  readonly pid: number
  /** Everything it wrote to stdout and stderr so far. */
  readonly output: () => string
  /** Resolves with the exit code (or signal) once it has exited. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
  readonly alive: () => boolean
  readonly kill: (sig?: NodeJS.Signals) => Promise<void>
}

const launch = (file: string, args: ReadonlyArray<string>, env: Record<string, string>): Proc => {
  const child = spawn(process.execPath, [file, ...args], {
    cwd: root,
    env: { ...process.env, ...env, [MARK_VAR]: mark },
    stdio: ["ignore", "pipe", "pipe"]
  })
  const chunks: Array<string> = []
  child.stdout!.setEncoding("utf8").on("data", (c: string) => chunks.push(c))
  child.stderr!.setEncoding("utf8").on("data", (c: string) => chunks.push(c))
  let done = false
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on("exit", (code, signal) => {
      done = true
      resolve({ code, signal })
    })
  )
  return {
    child,
    pid: child.pid!,
    output: () => chunks.join(""),
    exited,
    alive: () => !done,
    // A graceful signal gets ten seconds before SIGKILL follows it.
    kill: async (sig = "SIGKILL") => {
      if (!done) child.kill(sig)
      const t = sig === "SIGKILL" ? null : setTimeout(() => void (done || child.kill("SIGKILL")), 10_000)
      await exited
      if (t) clearTimeout(t)
    }
  }
}

/**
 * Polls `f` until it returns something truthy. The default bound is for
 * process start-up, not a claim about speed: a CI run with the packaging
 * installs and the documentation's servers beside it saw a controller take
 * over 20 s to reach its first scan phase.
 */
export const until = async <A>(what: string, f: () => Promise<A | undefined | null | false> | A | undefined | null | false, ms = 60_000, every = 25): Promise<A> => {
  const end = Date.now() + ms
  for (;;) {
    const v = await f()
    if (v) return v
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`)
    await new Promise((r) => setTimeout(r, every))
  }
}

/** The admin token of every server this suite starts. */
export const adminToken = `sfa_${randomBytes(24).toString("base64url")}`

/** A running server process. */
export interface ServerProc extends Proc {
  readonly url: string
}

/** A free loopback port (the kernel's pick, released at once). */
export const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const srv = createNetServer()
    srv.on("error", reject)
    srv.listen(0, "127.0.0.1", () => {
      const port = (srv.address() as { port: number }).port
      srv.close(() => resolve(port))
    })
  })

/** Starts `scanfleet-server serve` on a loopback port (a free one unless given) and waits for `/healthz`. */
export const startServer = async (opts: { readonly databaseUrl: string; readonly sweepIntervalMs?: number; readonly logLevel?: string; readonly port?: number; readonly poolSize?: number }): Promise<ServerProc> => {
  const port = opts.port ?? (await freePort())
  const p = launch((await bundles()).server, ["serve"], {
    SCANFLEET_DATABASE_URL: opts.databaseUrl,
    SCANFLEET_ADMIN_TOKEN: adminToken,
    SCANFLEET_HOST: "127.0.0.1",
    SCANFLEET_PORT: String(port),
    SCANFLEET_SWEEP_INTERVAL_MS: String(opts.sweepIntervalMs ?? 200),
    SCANFLEET_LOG_LEVEL: opts.logLevel ?? "debug",
    SCANFLEET_POOL_SIZE: String(opts.poolSize ?? 10)
  })
  const url = `http://127.0.0.1:${port}`
  try {
    await until(
      "the server to answer /healthz",
      async () => {
        if (!p.alive()) throw new Error(`the server exited before listening:\n${p.output()}`)
        return fetch(`${url}/healthz`).then((r) => r.ok, () => false)
      },
      // A loaded CI machine can take minutes to start a process; the hooks allow for it.
      150_000,
      50
    )
  } catch (e) {
    await p.kill("SIGKILL")
    throw e
  }
  return { ...p, url }
}

/** Starts `scanfleet-worker run` against `server`. */
export const startWorker = async (opts: {
  readonly server: string
  readonly token: string
  readonly state: string
  readonly scanner: string
  readonly slots?: number
  readonly permits?: number
  readonly pollMs?: number
  readonly env?: Record<string, string>
}): Promise<Proc> =>
  launch((await bundles()).worker, [
    "run",
    "--server", opts.server,
    "--token", opts.token,
    "--state", opts.state,
    "--scanner", opts.scanner,
    "--slots", String(opts.slots ?? 1),
    "--permits", String(opts.permits ?? opts.slots ?? 1),
    "--grace-ms", "300",
    "--poll-ms", String(opts.pollMs ?? 100)
  ], opts.env ?? {})

/** An HTTP answer: status and parsed JSON (the text when it is not JSON). */
export interface Answer {
  readonly status: number
  readonly body: any
  readonly text: string
}

/** Sends one request with an optional bearer token and a JSON (or raw) body. */
export const call = async (base: string, method: string, path: string, opts: { readonly token?: string | null; readonly body?: unknown; readonly raw?: string | Uint8Array; readonly headers?: Record<string, string> } = {}): Promise<Answer> => {
  const hasBody = opts.body !== undefined || opts.raw !== undefined
  const res = await fetch(base + path, {
    method,
    headers: { ...(opts.token ? { authorization: `Bearer ${opts.token}` } : {}), ...(hasBody ? { "content-type": "application/json" } : {}), ...opts.headers },
    body: opts.raw ?? (opts.body === undefined ? undefined : JSON.stringify(opts.body))
  })
  const text = await res.text()
  let body: unknown = text
  try {
    body = JSON.parse(text)
  } catch {
    // not JSON
  }
  return { status: res.status, body, text }
}

/** A fresh PostgreSQL database on the test server; `drop` removes it (closing what still uses it). */
export const database = async (pgUrl: string): Promise<{ readonly url: string; readonly name: string; readonly drop: () => Promise<void> }> => {
  const name = `sf_rel_${randomBytes(5).toString("hex")}`
  await withPg(pgUrl, (c) => c.query(`CREATE DATABASE ${name}`))
  const u = new URL(pgUrl)
  u.pathname = `/${name}`
  return { url: u.toString(), name, drop: () => closeSnapshots().then(() => withPg(pgUrl, (c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`))).then(() => {}) }
}

/** Runs `f` on one short-lived connection. */
export const withPg = async <A>(url: string, f: (c: pg.Client) => Promise<A>): Promise<A> => {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  try {
    return await f(c)
  } finally {
    await c.end()
  }
}

const readers = new Map<string, Promise<pg.Client>>()

/**
 * Every row of every table of the database, as one comparable value (read on one kept connection).
 * Not `claim_head` (migration 0013): where claims start scanning, derived from the targets'
 * rows, which the server's sweep raises on its own schedule over targets already claimed.
 */
export const snapshot = async (url: string): Promise<Record<string, Array<unknown>>> => {
  let reader = readers.get(url)
  if (!reader) {
    const c = new pg.Client({ connectionString: url })
    reader = c.connect().then(() => c)
    readers.set(url, reader)
  }
  const c = await reader
  const tables = (await c.query(`SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1`)).rows.map((r) => r.table_name as string)
  const out: Record<string, Array<unknown>> = {}
  for (const t of tables) if (t !== "claim_head") out[t] = (await c.query(`SELECT * FROM "${t}" ORDER BY 1`)).rows
  return out
}

/** Closes the connections `snapshot` kept. */
export const closeSnapshots = async (): Promise<void> => {
  const all = [...readers.values()]
  readers.clear()
  for (const r of all) await (await r).end().catch(() => {})
}

/** Live (non-zombie) processes carrying this file's mark, other than this one. */
export const marked = (): Array<{ pid: number; cmd: string }> => {
  const out: Array<{ pid: number; cmd: string }> = []
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "utf8")
      const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0]
      if (state === "Z" || state === "X") continue
      if (!readFileSync(`/proc/${name}/environ`, "utf8").split("\0").includes(`${MARK_VAR}=${mark}`)) continue
      out.push({ pid: Number(name), cmd: readFileSync(`/proc/${name}/cmdline`, "utf8").split("\0").join(" ").trim().slice(0, 160) })
    } catch {
      // gone meanwhile
    }
  }
  return out
}

/** Resident memory of a process in KiB (VmRSS), or null once it is gone. */
export const rssKiB = (pid: number): number | null => {
  try {
    const m = /VmRSS:\s+(\d+)\s+kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))
    return m ? Number(m[1]) : null
  } catch {
    return null
  }
}
