import { NodeHttpClient } from "@effect/platform-node"
import { DockerHub, GitHub, GitLab, HuggingFace } from "@scanfleet/adapters"
import * as FakeSources from "@scanfleet/adapters/testing/FakeSources"
import { Config, LogLine, Store } from "@scanfleet/core"
import { Scanner, Supervisor } from "@scanfleet/worker"
import { Effect, Layer, ManagedRuntime } from "effect"
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import { join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { z } from "zod"
import * as AdminRoutes from "../AdminRoutes.js"
import * as Database from "../Database.js"
import * as Scheduler from "../Scheduler.js"
import * as Server from "../Server.js"
import * as Sources from "../Sources.js"
import * as ServerConfig from "../ServerConfig.js"
import * as Tokens from "../Tokens.js"
import * as Catalogue from "./Catalogue.js"
import * as GitRepos from "./GitRepos.js"
import type * as Summary from "./Summary.js"

/**
 * The whole fleet in one process: the server (Worker API, admin API,
 * dashboard, expiry sweeper) on a database in a local data folder, the
 * discovery scheduler against local stand-ins of GitHub, GitLab, HuggingFace
 * and DockerHub (or the public APIs) whose targets are real git repositories
 * served on loopback, and two worker devices that clone them and scan them
 * with secretlint under the hard target-scan deadline.
 */

/** The managed configuration the demo applies: seconds instead of hours, so a newcomer sees every rule act within a minute. */
export const demoConfig: Config.ManagedConfig = {
  version: 1,
  assignments: { globalTtlSeconds: 30, handoffMarginSeconds: 2, overrides: { huggingface: { ttlSeconds: 40 } } },
  sources: {
    github: { scanTimeoutSeconds: 10, uploadTimeoutSeconds: 10, cooldownSeconds: 5, promotionBudget: 5, updatedRescans: true },
    gitlab: { scanTimeoutSeconds: 10, uploadTimeoutSeconds: 10, cooldownSeconds: 5, promotionBudget: 5, updatedRescans: true },
    huggingface: { scanTimeoutSeconds: 10, uploadTimeoutSeconds: 10, cooldownSeconds: 5, promotionBudget: 5, updatedRescans: true },
    dockerhub: { scanTimeoutSeconds: 10, uploadTimeoutSeconds: 10, cooldownSeconds: 5, promotionBudget: 0, updatedRescans: false }
  },
  expiry: { maxAttempts: 3 },
  metrics: { minSamples: 5 }
}

/** Where the public APIs are listed when the demo is pointed at them; tokens come from the environment. */
export const PublicSourcesSchema = Sources.SourcesFileSchema
/** The public-API sources file. */
export type PublicSources = Sources.SourcesFile

/** Demo options. */
export interface Options {
  /** The data folder: the SQLite database, the worker state files, the demo's tokens and its log. */
  readonly dataDir: string
  /** Listen port of the server; 0 picks a free one. */
  readonly port: number
  readonly host?: string
  /** Database URL (default `sqlite:<dataDir>/scanfleet.db`; `postgres://…` for PostgreSQL). */
  readonly databaseUrl?: string
  /** The admin token (default: generated once and kept in the data folder). */
  readonly adminToken?: string
  /** Discover from the local fakes (default) or from the public APIs. */
  readonly sources?: { readonly kind: "fake" } | { readonly kind: "public"; readonly settings: PublicSources; readonly env: Record<string, string | undefined> }
  /** Receives one JSON line per thing worth a log entry (device events, catalogue changes). */
  readonly log: (line: string) => void
}

/** A running demo. */
export interface Running {
  /** The server's base URL. */
  readonly url: string
  /** The dashboard URL; it carries the admin token once, which the server moves into a cookie. */
  readonly dashboardUrl: string
  readonly adminToken: string
  readonly databaseUrl: string
  /** The local fake APIs (null when discovering from the public APIs). */
  readonly fakes: FakeSources.FakeSources | null
  /** This run's number in the data folder (1 on an empty one). */
  readonly run: number
  /** The dashboard's headline numbers now. */
  readonly summary: () => Promise<Summary.Numbers>
  /** Discovery errors: how many cycles of each source failed, and the newest failure. */
  readonly sourceErrors: () => Promise<Summary.SourceErrors>
  /** Stops the workers (their scanner process groups are killed), the scheduler, the server and the fakes, in that order. */
  readonly stop: () => Promise<void>
  /** The stop steps still running and for how long: what a stop that hangs is waiting for. */
  readonly stopping: () => ReadonlyArray<{ readonly step: string; readonly ms: number }>
}

const StateSchema = z.object({
  adminToken: z.string().min(16),
  runs: z.number().int().min(0),
  devices: z.array(z.object({ name: z.string(), slots: z.number().int().min(1), token: z.string() }))
})
type State = z.infer<typeof StateSchema>

// The demo keeps its secrets in the data folder (never in the database, which holds only hashes) so a second run finds its devices again.
const loadState = (file: string): State | null => {
  if (!existsSync(file)) return null
  const parsed = StateSchema.safeParse(JSON.parse(readFileSync(file, "utf8")))
  return parsed.success ? parsed.data : null
}

const saveState = (file: string, state: State) => writeFileSync(file, `${JSON.stringify(state, null, 2)}\n`, { mode: 0o600 })

const deviceNames = ["device-a", "device-b"] as const

const fakeSchedules = (fakes: FakeSources.FakeSources) =>
  Effect.gen(function* () {
    const limits = { maxPages: 5, maxResults: 200 }
    const http = { retries: 1, backoffMs: 200, timeoutMs: 5000 }
    const every = (client: Scheduler.SourceSchedule["client"], intervalMs: number): Scheduler.SourceSchedule => ({ client, intervalMs, jitterMs: 500, limits })
    return [
      every(yield* GitHub.make({ ...http, baseUrl: fakes.github.url, pageSize: 4, listings: Catalogue.listings.githubOrgs.map((org) => ({ kind: "org" as const, org })) }), 3000),
      every(yield* GitLab.make({ ...http, baseUrl: fakes.gitlab.url, pageSize: 3 }), 3000),
      every(yield* HuggingFace.make({ ...http, baseUrl: fakes.huggingface.url, pageSize: 3 }), 3000),
      every(yield* DockerHub.make({ ...http, baseUrl: fakes.dockerhub.url, pageSize: 2, namespaces: [...Catalogue.listings.dockerhubNamespaces] }), 4000)
    ]
  })

/**
 * The demo's scanner: secretlint with its recommended rule preset over a clone
 * of the target's repository (the acquire step runs `git clone` against the
 * demo's git server). Exit 3 is findings, 0 clean, 2 usage.
 */
export const secretlintScanner = (gitUrl: string): Scanner.ParsedSpec =>
  Scanner.command({
    name: "secretlint",
    command: process.execPath,
    args: [fileURLToPath(new URL("./secretlint-scan.mjs", import.meta.url)), "{workDir}/repo", "--identity", "{identity}", "--slow-marker", Catalogue.slowMarker],
    acquire: { command: "git", args: ["clone", "-q", `${gitUrl}/{source}/{identity}/.git`, "{workDir}/repo"] },
    exitCodes: { "0": "clean", "3": "findings", "2": "usage" },
    otherwise: "scan_error",
    stop: "SIGTERM"
  })

/** The managed configuration for a run: the demo's seconds against the fakes; against the public APIs, cooldowns of a day. */
export const configFor = (sources: Options["sources"]): Config.ManagedConfig => {
  if (sources === undefined || sources.kind === "fake") return demoConfig
  const slow = (p: Config.SourcePolicy): Config.SourcePolicy => ({ ...p, cooldownSeconds: 86_400, promotionBudget: Math.min(p.promotionBudget, 20) })
  return {
    ...demoConfig,
    sources: {
      github: slow(demoConfig.sources.github),
      gitlab: slow(demoConfig.sources.gitlab),
      huggingface: slow(demoConfig.sources.huggingface),
      dockerhub: slow(demoConfig.sources.dockerhub)
    }
  }
}

/**
 * Starts the demo fleet and resolves once the server listens, the devices
 * are registered and the workers are claiming.
 *
 * @example
 * const demo = await Demo.start({ dataDir: ".data/demo", port: 0, log: () => {} })
 * console.log(demo.dashboardUrl)
 * await demo.stop()
 */
export const start = async (opts: Options): Promise<Running> => {
  const dataDir = resolve(opts.dataDir)
  mkdirSync(dataDir, { recursive: true })
  const stateFile = join(dataDir, "demo.json")
  const prior = loadState(stateFile)
  const state: State = {
    adminToken: opts.adminToken ?? prior?.adminToken ?? Tokens.generate().replace(Tokens.prefix, "sfa_"),
    runs: (prior?.runs ?? 0) + 1,
    devices: prior?.devices ?? []
  }
  const run = state.runs
  // The one log schema (LogLine); an event ending in "_error" is logged at error level.
  const log = (event: string, fields: Record<string, unknown> = {}) =>
    opts.log(LogLine.format({ time: Date.now(), level: event.endsWith("_error") || event === "worker_error" ? "error" : event === "worker_retry" ? "warning" : "info", message: event, fields }, "json"))
  const sources = opts.sources ?? { kind: "fake" as const }

  // Each stop step is named and timed (`demo_stop_step`), so a stop that hangs says which step it waits for.
  const inFlight = new Map<string, number>()
  const step = async (name: string, f: () => Promise<void>) => {
    const at = Date.now()
    inFlight.set(name, at)
    try {
      await f()
    } catch (e) {
      log("demo_stop_error", { step: name, message: e instanceof Error ? e.message : String(e) })
    } finally {
      inFlight.delete(name)
      log("demo_stop_step", { step: name, ms: Date.now() - at })
    }
  }
  const stopping = () => [...inFlight].map(([name, at]) => ({ step: name, ms: Date.now() - at }))
  const cleanups: Array<{ readonly name: string; readonly run: () => Promise<void> }> = []
  const cleanup = async () => {
    for (const c of cleanups.splice(0).reverse()) await step(c.name, c.run)
  }

  try {
    const fakes = sources.kind === "fake" ? await FakeSources.start() : null
    if (fakes) {
      cleanups.push({ name: "fake sources", run: () => fakes.close() })
      Catalogue.seed(fakes, run)
    }
    // The targets' content: real git repositories on loopback, cloned by the workers' acquire step.
    const repos = await GitRepos.start(join(dataDir, "git"), Catalogue.repository)
    cleanups.push({ name: "git repositories", run: () => repos.close() })
    for (const key of Object.keys(Catalogue.commits)) {
      const [source, identity] = [key.slice(0, key.indexOf(":")), key.slice(key.indexOf(":") + 1)]
      await repos.ensure(source, identity, Catalogue.repository(source, identity))
    }

    const databaseUrl = opts.databaseUrl ?? `sqlite:${join(dataDir, "scanfleet.db")}`
    const config = ServerConfig.make({
      databaseUrl,
      host: opts.host ?? "127.0.0.1",
      port: opts.port,
      adminToken: state.adminToken,
      sweepIntervalMs: 500,
      // Well inside main.ts's 30 s before it gives up on the stop.
      shutdownGraceMs: 5000,
      logLevel: "info"
    })
    const schedules = sources.kind === "public" ? Sources.schedules(sources.settings, sources.env) : fakeSchedules(fakes!)
    const discovery = Layer.unwrapEffect(Effect.map(schedules, Scheduler.layer)).pipe(Layer.provide(NodeHttpClient.layerUndici))
    const live = discovery.pipe(Layer.provideMerge(Server.layer(config)), Layer.provide(Database.layer(config.databaseUrl, { poolSize: 4 })))
    const rt = ManagedRuntime.make(live)
    cleanups.push({ name: "server runtime", run: () => rt.dispose() })
    const info = await rt.runPromise(Server.Info)
    const store = await rt.runPromise(Store.Store)
    // Counted as a run (and the admin token kept) only once the server listens: a start that failed leaves nothing behind.
    saveState(stateFile, state)
    log("server_listening", { url: info.url, database: Database.redact(config.databaseUrl), run })

    // Apply the demo's configuration only when it is not already in force: a second run adds no version.
    const wanted = configFor(sources)
    await rt.runPromise(
      Effect.gen(function* () {
        const active = yield* store.activeConfig()
        if (active === null || JSON.stringify(active.document) !== JSON.stringify(wanted)) {
          const v = yield* store.applyConfig(wanted, "demo", Date.now())
          log("config_applied", { version: v.version })
        }
      })
    )

    // Devices: reuse the tokens kept in the data folder while the database still knows them; register anew otherwise.
    const devices: Array<{ name: string; slots: number; token: string }> = []
    for (const name of deviceNames) {
      const kept = state.devices.find((d) => d.name === name)
      const known = kept ? await rt.runPromise(store.deviceByTokenHash(Tokens.hash(kept.token))) : null
      if (kept && known) {
        devices.push(kept)
        continue
      }
      const token = Tokens.generate()
      const d = await rt.runPromise(store.addDevice({ name, slots: 2, tokenHash: Tokens.hash(token), now: Date.now() }))
      log("device_registered", { deviceId: d.id, name })
      devices.push({ name, slots: d.slots, token })
    }
    state.devices = devices
    saveState(stateFile, state)

    const scanner = secretlintScanner(repos.url)
    const running: Array<{ readonly name: string; readonly device: Supervisor.Device }> = []
    cleanups.push({ name: "workers", run: async () => void (await Promise.all(running.map((d) => step(`worker ${d.name}`, () => d.device.stop())))) })
    for (const d of devices) {
      const device = await Supervisor.start({
        server: info.url,
        token: d.token,
        slots: d.slots,
        scanner,
        state: join(dataDir, `worker-${d.name}.db`),
        graceMs: 500,
        pollMs: 500,
        drainMs: 2000,
        minBackoffMs: 100,
        maxBackoffMs: 2000,
        onEvent: ({ type, ...e }) => log(`worker_${type}`, { device: d.name, ...e })
      })
      running.push({ name: d.name, device })
    }

    // The catalogue changes over time: known targets pushed again after their first scan, and new ones arriving.
    const timers: Array<NodeJS.Timeout> = []
    cleanups.push({ name: "catalogue timers", run: async () => timers.forEach(clearTimeout) })
    if (fakes) {
      const startedAt = Date.now()
      const pushed = new Set<string>()
      const arrived = new Set<string>()
      let busy = false
      const tick = async () => {
        if (busy) return
        busy = true
        try {
          const done = await rt.runPromise(store.listAssignments({ state: "completed", limit: 10_000 }))
          for (const c of Catalogue.changes) {
            const key = `${c.source}:${c.identity}`
            if (pushed.has(key) || !done.some((a) => a.source === c.source && a.identity === c.identity)) continue
            pushed.add(key)
            const commit = Catalogue.commits[key]
            if (commit) await repos.commit(c.source, c.identity, commit)
            c.apply(fakes, Date.now())
            log("catalogue_pushed_again", { source: c.source, identity: c.identity })
          }
          for (const a of Catalogue.arrivals(run)) {
            if (arrived.has(a.label) || Date.now() - startedAt < a.afterMs) continue
            arrived.add(a.label)
            a.apply(fakes, Date.now())
            log("catalogue_arrival", { target: a.label })
          }
        } catch (e) {
          log("catalogue_error", { message: e instanceof Error ? e.message : String(e) })
        } finally {
          busy = false
        }
      }
      timers.push(setInterval(() => void tick(), 1000))
    }

    const dashboardUrl = `${info.url}/?token=${encodeURIComponent(state.adminToken)}`
    let stopped: Promise<void> | null = null
    return {
      url: info.url,
      dashboardUrl,
      adminToken: state.adminToken,
      databaseUrl: Database.redact(config.databaseUrl),
      fakes,
      run,
      summary: () => rt.runPromise(AdminRoutes.summaryData),
      sourceErrors: () =>
        rt.runPromise(
          Effect.map(store.listCycles({ limit: 500 }), (cycles) => {
            const failed = cycles.filter((c) => c.error !== null)
            const newest = failed.reduce<(typeof failed)[number] | undefined>((a, c) => (a === undefined || c.endedAt > a.endedAt ? c : a), undefined)
            const bySource: Record<string, number> = { github: 0, gitlab: 0, huggingface: 0, dockerhub: 0 }
            for (const c of failed) bySource[c.source] = (bySource[c.source] ?? 0) + 1
            return { bySource, last: newest ? { at: newest.endedAt, text: `${newest.source}: ${newest.error}` } : null }
          })
        ),
      stop: () => (stopped ??= cleanup()),
      stopping
    }
  } catch (e) {
    await cleanup()
    throw e
  }
}
