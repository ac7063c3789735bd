import { NodeHttpClient, NodeRuntime } from "@effect/platform-node"
import { Config, Store } from "@scanfleet/core"
import { Clock, Effect, Either, Layer } from "effect"
import { readFileSync } from "node:fs"
import * as AdminCommands from "./AdminCommands.js"
import * as Database from "./Database.js"
import * as FindingCli from "./FindingCli.js"
import * as Scheduler from "./Scheduler.js"
import * as Server from "./Server.js"
import * as Sources from "./Sources.js"
import * as ServerConfig from "./ServerConfig.js"
import * as Tokens from "./Tokens.js"

/** The usage text of `scanfleet-server`. */
export const usage = `scanfleet-server <command> [options]

Commands:
  serve                                  run the server (Worker API, admin API, dashboard, /metrics, expiry sweeper)
  migrate                                bring the database schema up to date and exit
  device add --name NAME [--slots N]     register a device; prints its token once
  config preview FILE                    validate a managed configuration document; writes nothing
  config apply FILE [--by NAME]          validate and store it as the next version
${FindingCli.usage}

Options:
  --config FILE        JSON settings file (also SCANFLEET_CONFIG)
  --database URL       sqlite:<path> (default sqlite:./scanfleet.db), postgres://..., or memory:
  --host HOST          listen address (default 127.0.0.1)
  --port PORT          listen port (default 8080; 0 picks a free one)
  --sources FILE       serve: run discovery from this sources file (also SCANFLEET_SOURCES_FILE);
                       tokens from GITHUB_TOKEN, GITLAB_TOKEN, HF_TOKEN, DOCKERHUB_USERNAME/DOCKERHUB_TOKEN

Environment: SCANFLEET_DATABASE_URL, SCANFLEET_HOST, SCANFLEET_PORT, SCANFLEET_ADMIN_TOKEN,
SCANFLEET_SWEEP_INTERVAL_MS, SCANFLEET_POOL_SIZE, SCANFLEET_PG_PREPARE (on|off), SCANFLEET_LOG_LEVEL.
The admin token is required by serve.

${AdminCommands.usage}`

/** A command line that cannot be run as given. */
export class UsageError extends Error {}

/** Parsed `--flag value` pairs and positional words. */
export const parseArgs = (argv: ReadonlyArray<string>): { readonly words: Array<string>; readonly flags: Map<string, string> } => {
  const words: Array<string> = []
  const flags = new Map<string, string>()
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    if (a === "--help" || a === "-h") flags.set("help", "true")
    else if (a.startsWith("--")) {
      const eq = a.indexOf("=")
      if (eq > 0) flags.set(a.slice(2, eq), a.slice(eq + 1))
      else {
        const v = argv[i + 1]
        if (v === undefined || v.startsWith("--")) throw new UsageError(`${a} needs a value`)
        flags.set(a.slice(2), v)
        i++
      }
    } else words.push(a)
  }
  return { words, flags }
}

const settings = (flags: Map<string, string>, env: Record<string, string | undefined>, needAdminToken: boolean) => {
  const overrides: Partial<ServerConfig.ServerConfigInput> = {}
  if (flags.has("database")) overrides.databaseUrl = flags.get("database")!
  if (flags.has("host")) overrides.host = flags.get("host")!
  if (flags.has("port")) {
    const p = Number(flags.get("port"))
    if (!Number.isInteger(p)) throw new UsageError("--port must be an integer")
    overrides.port = p
  }
  // Commands other than serve never check the admin token; a throwaway one satisfies the schema.
  const e = needAdminToken || env.SCANFLEET_ADMIN_TOKEN ? env : { ...env, SCANFLEET_ADMIN_TOKEN: Tokens.generate() }
  return ServerConfig.load({ file: flags.get("config"), env: e, overrides })
}

const withStore = <A, E>(config: ServerConfig.ServerConfig, f: (store: Store.StoreShape) => Effect.Effect<A, E>) =>
  Effect.flatMap(Store.Store, f).pipe(Effect.provide(Database.layer(config.databaseUrl, { poolSize: config.poolSize, prepare: config.pgPrepare })))

const readDocument = (file: string): unknown => {
  const text = readFileSync(file, "utf8")
  try {
    return JSON.parse(text)
  } catch (e) {
    throw new UsageError(`${file} is not valid JSON: ${(e as Error).message}`)
  }
}

const printViolations = (vs: ReadonlyArray<Config.Violation>) => {
  console.error(`invalid configuration (${vs.length} violation${vs.length === 1 ? "" : "s"}); nothing was stored:`)
  for (const v of vs) console.error(`  ${v.path.join(".") || "(root)"}: ${v.message}`)
}

/**
 * Runs one command line. `serve` runs until SIGINT or SIGTERM, then shuts
 * down gracefully; the other commands resolve with the process exit code.
 */
export const main = async (argv: ReadonlyArray<string>, env: Record<string, string | undefined> = process.env): Promise<number> => {
  let parsed: ReturnType<typeof parseArgs>
  try {
    parsed = parseArgs(argv)
  } catch (e) {
    console.error(`${(e as Error).message}\n\n${usage}`)
    return 2
  }
  const { words, flags } = parsed
  if (flags.has("help") || words.length === 0) {
    console.log(usage)
    return words.length === 0 && !flags.has("help") ? 2 : 0
  }
  try {
    const cmd = words.join(" ")
    if (words[0] === "serve") {
      const config = settings(flags, env, true)
      const sourcesFile = flags.get("sources") ?? env.SCANFLEET_SOURCES_FILE
      const server = Server.layer(config)
      const sources = sourcesFile ? Sources.load(sourcesFile) : undefined
      // With a sources file the scheduler runs beside the server and writes through its (counted) store.
      const withDiscovery = sources
        ? Layer.unwrapEffect(Effect.map(Sources.schedules(sources, env), (ss) => Scheduler.layer(ss, Sources.lease(sources)))).pipe(
            Layer.provide(NodeHttpClient.layerUndici),
            Layer.provideMerge(server)
          )
        : server
      const live = withDiscovery.pipe(Layer.provide(Database.layer(config.databaseUrl, { poolSize: config.poolSize, prepare: config.pgPrepare })))
      // runMain interrupts on SIGINT/SIGTERM: the listener stops, requests in flight finish, the pool closes.
      NodeRuntime.runMain(Layer.launch(live).pipe(Effect.tapErrorCause((c) => Effect.logError("server failed", c)), Effect.provide(Server.logger(config.logLevel))), {
        disableErrorReporting: true,
        disablePrettyLogger: true
      })
      return await new Promise<number>(() => {})
    }
    if (words[0] === "findings") return await FindingCli.main(words.slice(1), flags, settings(flags, env, false), (t) => process.stdout.write(t), (t) => console.error(t))
    if (cmd === "migrate") {
      const config = settings(flags, env, false)
      await Effect.runPromise(withStore(config, () => Effect.void))
      console.log(`schema up to date: ${Database.redact(config.databaseUrl)}`)
      return 0
    }
    if (cmd === "device add") {
      const config = settings(flags, env, false)
      const name = flags.get("name")
      const slots = Number(flags.get("slots") ?? "1")
      if (!name) throw new UsageError("device add needs --name NAME")
      if (!Number.isInteger(slots) || slots < 1 || slots > 1024) throw new UsageError("--slots must be an integer from 1 to 1024")
      const token = Tokens.generate()
      const d = await Effect.runPromise(
        withStore(config, (store) => Effect.flatMap(Clock.currentTimeMillis, (now) => store.addDevice({ name, slots, tokenHash: Tokens.hash(token), now })))
      )
      console.error(`device ${d.id} "${d.name}" registered with ${d.slots} slot(s). Its token is shown once; store it now:`)
      console.log(token)
      return 0
    }
    if (words[0] === "config" && (words[1] === "preview" || words[1] === "apply") && words.length === 3) {
      const doc = readDocument(words[2])
      const r = Config.preview(doc)
      if (Either.isLeft(r)) {
        printViolations(r.left)
        return 1
      }
      if (words[1] === "preview") {
        console.log(`valid. Effective assignment policy per source (nothing was written):`)
        for (const p of (["github", "gitlab", "huggingface", "dockerhub"] as const).map((s) => Config.effectivePolicy(r.right, s)))
          console.log(`  ${p.source}: TTL ${p.ttlSeconds} s (${p.origin}), scan ${p.scanTimeoutSeconds} s, upload ${p.uploadTimeoutSeconds} s, margin ${p.handoffMarginSeconds} s`)
        return 0
      }
      const config = settings(flags, env, false)
      const by = flags.get("by") ?? env.USER ?? "cli"
      const v = await Effect.runPromise(withStore(config, (store) => Effect.flatMap(Clock.currentTimeMillis, (now) => store.applyConfig(r.right, by, now))))
      console.log(`applied as version ${v.version} by ${v.appliedBy}`)
      return 0
    }
    const operator = await AdminCommands.run(words, flags, env)
    if (operator !== null) return operator
    throw new UsageError(`unknown command: ${cmd}`)
  } catch (e) {
    if (e instanceof UsageError || e instanceof AdminCommands.UsageError || e instanceof FindingCli.FindingsUsageError) {
      console.error(`${e.message}\n\n${usage}`)
      return 2
    }
    if (e instanceof ServerConfig.ServerConfigError || e instanceof Sources.SourcesFileError) {
      console.error(e.message)
      return 2
    }
    console.error(`failed: ${e instanceof Error ? e.message : String(e)}`)
    return 1
  }
}
