import { Args, Command, Options } from "@effect/cli"
import { NodeHttpClient } from "@effect/platform-node"
import { Config as ManagedConfig, LogLine, type Operations, type Store, WorkerApi } from "@scanfleet/core"
import { CommandLine } from "@scanfleet/worker"
import { Clock, Effect, Either, FiberRef, Layer, type LogLevel, Option, Redacted } from "effect"
import { readFileSync } from "node:fs"
import * as AdminCommands from "./AdminCommands.js"
import * as Audited from "./internal/Audited.js"
import pkg from "../package.json" with { type: "json" }
import * as Database from "./Database.js"
import * as FindingCli from "./FindingCli.js"
import * as Scheduler from "./Scheduler.js"
import * as Server from "./Server.js"
import * as ServerConfig from "./ServerConfig.js"
import * as Shutdown from "./Shutdown.js"
import * as Sources from "./Sources.js"
import * as Tokens from "./Tokens.js"

/**
 * The `scanfleet-server` command: `serve`, `migrate`, `device add`,
 * `config preview` and `config apply`, and the operator commands that call a
 * running server's admin API (`targets`, `assignments`, `sources`, `devices`, `audit`), and
 * `findings list`, `findings target` and `findings export`, which read the database. Settings come from an
 * optional JSON settings file, then `SCANFLEET_*` environment variables, then flags; a command's
 * `--help` names each of its settings' flags with its variable (docs/server.md lists the settings
 * that have neither).
 */

type Field = keyof typeof ServerConfig.envVars extends infer K ? (K extends keyof typeof ServerConfig.envVars ? (typeof ServerConfig.envVars)[K] : never) : never
const envOf = (field: Field): string => Object.entries(ServerConfig.envVars).find(([, f]) => f === field)![0]
const described = <A>(o: Options.Options<A>, what: string, env: string) => o.pipe(Options.withDescription(`${what} (env ${env})`), Options.optional)

const common = {
  config: described(Options.text("config"), "JSON settings file; environment variables and flags override it", "SCANFLEET_CONFIG"),
  database: described(Options.text("database"), "sqlite:<path> or a path, postgres://… or postgresql://…, or memory: (default sqlite:./scanfleet.db)", envOf("databaseUrl")),
  logFormat: described(Options.choice("log-format", LogLine.formats), "json lines, or pretty for people (default json)", envOf("logFormat"))
}

// @effect/cli's log levels, as the server's.
const levels: Record<LogLevel.LogLevel["_tag"], ServerConfig.ServerConfig["logLevel"]> = {
  All: "debug",
  Trace: "debug",
  Debug: "debug",
  Info: "info",
  Warning: "warning",
  Error: "error",
  Fatal: "error",
  None: "none"
}

const serveOptions = {
  ...common,
  host: described(Options.text("host"), "listen address (default 127.0.0.1)", envOf("host")),
  port: described(Options.integer("port"), "listen port (default 8080; 0 picks a free one)", envOf("port")),
  adminToken: described(
    Options.redacted("admin-token"),
    "required: bearer token of /v1/admin/* and the dashboard, at least 16 visible ASCII characters without spaces",
    envOf("adminToken")
  ),
  // The same values as @effect/cli's own --log-level (all and trace mean debug, fatal means error), so where the flag stands changes nothing.
  logLevel: described(
    Options.choiceWithValue("log-level", Object.entries(levels).map(([tag, level]): [string, ServerConfig.ServerConfig["logLevel"]] => [tag.toLowerCase(), level])),
    "the least severe log line written: debug, info, warning, error or none (default info)",
    envOf("logLevel")
  ),
  sweepIntervalMs: described(Options.integer("sweep-interval-ms"), "how often the expiry sweeper runs, ms (default 1000)", envOf("sweepIntervalMs")),
  poolSize: described(Options.integer("pool-size"), "PostgreSQL connection pool size (default 10)", envOf("poolSize")),
  pgPrepare: described(Options.choice("pg-prepare", ["on", "off"]), "PostgreSQL prepared hot statements; off behind a transaction pooler (default on)", envOf("pgPrepare")),
  sources: described(
    Options.text("sources"),
    "run discovery from this sources file; tokens from GITHUB_TOKEN, GITLAB_TOKEN, HF_TOKEN, DOCKERHUB_USERNAME/DOCKERHUB_TOKEN",
    "SCANFLEET_SOURCES_FILE"
  )
}

interface Given {
  readonly config: Option.Option<string>
  readonly database: Option.Option<string>
  readonly logFormat: Option.Option<LogLine.Format>
  readonly host?: Option.Option<string>
  readonly port?: Option.Option<number>
  readonly adminToken?: Option.Option<Redacted.Redacted<string>>
  readonly sweepIntervalMs?: Option.Option<number>
  readonly poolSize?: Option.Option<number>
  readonly pgPrepare?: Option.Option<"on" | "off">
  readonly logLevel?: Option.Option<ServerConfig.ServerConfig["logLevel"]>
}

// Set by `main`: @effect/cli consumes its own --log-level flag (given before the command, or as
// a command's only flag) before a handler runs; `serve`'s own --log-level is read as a flag.
let explicitLogLevel = false

/** The settings: the file, then `SCANFLEET_*`, then flags (`serve --log-level`, or @effect/cli's own `--log-level`). */
const settings = (given: Given, env: Record<string, string | undefined>, needAdminToken: boolean) =>
  Effect.gen(function* () {
    const overrides: Partial<ServerConfig.ServerConfigInput> = {}
    const pick = <A>(o: Option.Option<A> | undefined): A | undefined => (o === undefined ? undefined : Option.getOrUndefined(o))
    const entries: Partial<ServerConfig.ServerConfigInput> = {
      databaseUrl: pick(given.database),
      logFormat: pick(given.logFormat),
      host: pick(given.host),
      port: pick(given.port),
      sweepIntervalMs: pick(given.sweepIntervalMs),
      poolSize: pick(given.poolSize),
      adminToken: Option.getOrUndefined(Option.map(given.adminToken ?? Option.none(), Redacted.value)),
      pgPrepare: Option.getOrUndefined(Option.map(given.pgPrepare ?? Option.none(), (v) => v === "on")),
      logLevel: pick(given.logLevel) ?? (explicitLogLevel ? levels[(yield* FiberRef.get(FiberRef.currentMinimumLogLevel))._tag] : undefined)
    }
    for (const [k, v] of Object.entries(entries)) if (v !== undefined) Object.assign(overrides, { [k]: v })
    // Commands other than serve never check the admin token; a throwaway one satisfies the schema.
    const e = needAdminToken || env.SCANFLEET_ADMIN_TOKEN ? env : { ...env, SCANFLEET_ADMIN_TOKEN: Tokens.generate() }
    return yield* Effect.try({
      try: () => ServerConfig.load({ file: Option.getOrUndefined(given.config), env: e, overrides }),
      catch: (err) => (err instanceof ServerConfig.ServerConfigError ? new CommandLine.UsageError({ message: err.message }) : new CommandLine.CommandFailed({ message: String(err) }))
    })
  })

const withStore = <A, E>(config: ServerConfig.ServerConfig, f: Effect.Effect<A, E, Store.Store | Operations.Operations>) =>
  f.pipe(Effect.provide(Database.layer(config.databaseUrl, Database.optionsOf(config))))

// Who acts, for the audit log: --by, else $USER, as the admin API reads X-Scanfleet-Actor.
const actorOf = (by: Option.Option<string>) => {
  const who = Option.getOrElse(by, () => process.env.USER ?? "cli").trim() || "cli"
  const why = WorkerApi.labelProblem(who) ?? WorkerApi.refuseString(who, WorkerApi.maxActorLength)
  return why ? Effect.fail(new CommandLine.UsageError({ message: `--by (or $USER) ${why}` })) : Effect.succeed(who)
}

const readDocument = (file: string) =>
  Effect.try({
    try: (): unknown => JSON.parse(readFileSync(file, "utf8")),
    catch: (e) => new CommandLine.UsageError({ message: `${file} is not a readable JSON document: ${(e as Error).message}` })
  })

const serve = Command.make("serve", serveOptions, (o) =>
  Effect.gen(function* () {
    const config = yield* settings(o, process.env, true)
    const sourcesFile = Option.getOrUndefined(o.sources) ?? process.env.SCANFLEET_SOURCES_FILE
    const server = Server.layer(config)
    // With a sources file the scheduler runs beside the server and writes through its (counted) store.
    const sourcesConfig = sourcesFile
      ? yield* Effect.try({
          try: () => Sources.load(sourcesFile),
          catch: (e) => (e instanceof Sources.SourcesFileError ? new CommandLine.UsageError({ message: e.message }) : new CommandLine.CommandFailed({ message: String(e) }))
        })
      : undefined
    const withDiscovery = sourcesConfig
      ? Layer.unwrapEffect(
          Effect.map(
            Effect.try({
              try: () => Sources.schedules(sourcesConfig, process.env),
              catch: (e) => (e instanceof Sources.SourcesFileError ? new CommandLine.UsageError({ message: e.message }) : new CommandLine.CommandFailed({ message: String(e) }))
            }).pipe(Effect.flatten),
            // stopped by the server's shutdown deadline: a cycle stuck on the database does not hold the exit
            (ss) => Shutdown.bounded("discovery", Scheduler.layer(ss, Sources.lease(sourcesConfig)))
          )
        ).pipe(Layer.provide(NodeHttpClient.layerUndici), Layer.provideMerge(server))
      : server
    const live = withDiscovery.pipe(Layer.provide(Database.layer(config.databaseUrl, Database.optionsOf(config))))
    // Interrupted on SIGINT/SIGTERM (CommandLine.run): the listener stops, requests in flight finish by the shutdown deadline, the pool closes.
    yield* Layer.launch(live).pipe(Effect.tapErrorCause((c) => Effect.logError("server failed", c)), Effect.provide(Server.logger(config.logLevel, config.logFormat)))
  })
).pipe(Command.withDescription("run the server: Worker API, admin API, dashboard, /metrics and the expiry sweeper"))

const migrate = Command.make("migrate", common, (o) =>
  Effect.gen(function* () {
    const config = yield* settings(o, process.env, false)
    yield* withStore(config, Effect.void)
    yield* CommandLine.print(`schema up to date: ${Database.redact(config.databaseUrl)}`)
  })
).pipe(Command.withDescription("bring the database schema up to date and exit"))

const deviceAdd = Command.make(
  "add",
  {
    ...common,
    name: Options.text("name").pipe(Options.withDescription("the device's name")),
    by: described(Options.text("by"), "who registers it, for the audit log (default $USER)", "USER"),
    slots: Options.integer("slots").pipe(Options.withDescription("how many assignments it runs at once, 1 to 1024"), Options.withDefault(1))
  },
  (o) =>
    Effect.gen(function* () {
      const config = yield* settings(o, process.env, false)
      if (!Number.isInteger(o.slots) || o.slots < 1 || o.slots > 1024) return yield* new CommandLine.UsageError({ message: "--slots must be an integer from 1 to 1024" })
      const named = WorkerApi.DeviceCreate.shape.name.safeParse(o.name)
      if (!named.success) return yield* new CommandLine.UsageError({ message: `--name ${named.error.issues.map((i) => i.message).join("; ")}` })
      const by = yield* actorOf(o.by)
      const token = Tokens.generate()
      const d = yield* withStore(config, Effect.flatMap(Clock.currentTimeMillis, (now) => Audited.addDevice({ name: o.name, slots: o.slots, tokenHash: Tokens.hash(token) }, by, now)))
      yield* CommandLine.printError(`device ${d.id} "${d.name}" registered with ${d.slots} slot(s). Its token is shown once; store it now:`)
      yield* CommandLine.print(token)
    })
).pipe(Command.withDescription("register a device; prints its token once"))

const device = Command.make("device").pipe(Command.withDescription("manage worker devices"), Command.withSubcommands([deviceAdd]))

const file = Args.text({ name: "FILE" }).pipe(Args.withDescription("a managed configuration document (JSON)"))

/** Validates a managed configuration document; prints the violations and fails (exit 1) when it is invalid. */
const validated = (path: string) =>
  Effect.flatMap(readDocument(path), (doc) => {
    const r = ManagedConfig.preview(doc)
    if (Either.isRight(r)) return Effect.succeed(r.right)
    const vs = r.left
    return Effect.zipRight(
      Effect.forEach([`invalid configuration (${vs.length} violation${vs.length === 1 ? "" : "s"}); nothing was stored:`, ...vs.map((v) => `  ${v.path.join(".") || "(root)"}: ${v.message}`)], CommandLine.printError),
      Effect.fail(new CommandLine.CommandFailed({ message: `${path} is not a valid configuration` }))
    )
  })

const preview = Command.make("preview", { file }, ({ file }) =>
  Effect.gen(function* () {
    const doc = yield* validated(file)
    yield* CommandLine.print(`valid. Effective assignment policy per source (nothing was written):`)
    for (const p of (["github", "gitlab", "huggingface", "dockerhub"] as const).map((s) => ManagedConfig.effectivePolicy(doc, s)))
      yield* CommandLine.print(`  ${p.source}: TTL ${p.ttlSeconds} s (${p.origin}), scan ${p.scanTimeoutSeconds} s, upload ${p.uploadTimeoutSeconds} s, margin ${p.handoffMarginSeconds} s`)
  })
).pipe(Command.withDescription("validate a managed configuration document; writes nothing"))

const apply = Command.make(
  "apply",
  { ...common, file, by: described(Options.text("by"), "who applies it (default $USER)", "USER") },
  (o) =>
    Effect.gen(function* () {
      const doc = yield* validated(o.file)
      const config = yield* settings(o, process.env, false)
      const by = yield* actorOf(o.by)
      const v = yield* withStore(config, Effect.flatMap(Clock.currentTimeMillis, (now) => Audited.applyConfig(doc, by, now)))
      yield* CommandLine.print(`applied as version ${v.version} by ${v.appliedBy}`)
    })
).pipe(Command.withDescription("validate a managed configuration document and store it as the next version"))

const config = Command.make("config").pipe(Command.withDescription("the managed runtime configuration"), Command.withSubcommands([preview, apply]))

// `findings …` reads the database directly (like migrate); its flags are collected into the map
// FindingCli.main reads, so the command line and the queries have one implementation.
const optional = (name: string, what: string) => Options.text(name).pipe(Options.withDescription(what), Options.optional)
const findingFilters = {
  source: optional("source", "only findings of this source"),
  identity: optional("identity", "only findings of this target identity"),
  detector: optional("detector", "only findings of this detector"),
  status: optional("status", "new, open or resolved"),
  verified: optional("verified", "true or false"),
  since: optional("since", "only findings seen since (ISO time)")
}

const findingsRun = (words: ReadonlyArray<string>, given: Record<string, unknown>) =>
  Effect.gen(function* () {
    const config = yield* settings(given as unknown as Given, process.env, false)
    const flags = new Map<string, string>()
    for (const [k, v] of Object.entries(given)) if (k in findingFilters || k === "after" || k === "limit" || k === "format") if (Option.isOption(v) && Option.isSome(v)) flags.set(k, String(v.value))
    const code = yield* Effect.tryPromise({
      try: () => FindingCli.main(words, flags, config, (t) => process.stdout.write(t), (t) => process.stderr.write(`${t}\n`)),
      catch: (e) => (e instanceof FindingCli.FindingsUsageError ? new CommandLine.UsageError({ message: e.message }) : new CommandLine.CommandFailed({ message: `failed: ${(e as Error).message}` }))
    })
    if (code !== 0) return yield* new CommandLine.CommandFailed({ message: "no such findings", code })
  })

const findings = Command.make("findings").pipe(
  Command.withDescription("the findings the fleet reported (redacted; read from the database)"),
  Command.withSubcommands([
    Command.make("list", { ...common, ...findingFilters, after: optional("after", "the cursor printed after the previous page"), limit: optional("limit", "how many, 1 to 1000") }, (o) =>
      findingsRun(["list"], o)
    ).pipe(Command.withDescription("findings as JSON lines, in id order; the next page's cursor on stderr")),
    Command.make("target", { ...common, source: Args.text({ name: "SOURCE" }), identity: Args.text({ name: "IDENTITY" }) }, ({ source, identity, ...o }) =>
      findingsRun(["target", source, identity], o)
    ).pipe(Command.withDescription("one target's findings, their history and its scans (JSON)")),
    Command.make("export", { ...common, ...findingFilters, format: Options.choice("format", ["jsonl", "sarif"]).pipe(Options.withDescription("JSON lines or a SARIF 2.1.0 log (default jsonl)"), Options.optional) }, (o) =>
      findingsRun(["export"], o)
    ).pipe(Command.withDescription("every matching finding as JSON lines or a SARIF 2.1.0 log"))
  ])
)

// The command tree.
const command = Command.make("scanfleet-server").pipe(
  Command.withDescription("the example scanfleet server"),
  Command.withSubcommands([serve, migrate, device, config, findings, ...AdminCommands.commands])
)

/** The version the command reports. */
export const version: string = pkg.version

/**
 * Runs one command line and resolves with the process exit code. `serve`
 * runs until SIGINT or SIGTERM, then shuts down gracefully and resolves 0.
 */
export const main = (argv: ReadonlyArray<string>, io: CommandLine.Io = CommandLine.processIo): Promise<number> => {
  explicitLogLevel = argv.some((a) => a === "--log-level" || a.startsWith("--log-level="))
  return CommandLine.run({ name: "scanfleet-server", version, command }, argv, io)
}
