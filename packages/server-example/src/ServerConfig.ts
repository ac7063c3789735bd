import { Database } from "@scanfleet/adapters"
import { LogLine } from "@scanfleet/core"
import { readFileSync } from "node:fs"
import { Context } from "effect"
import { z } from "zod"
import { urlProblem } from "./Webhooks.js"

/** The log levels a server takes, least severe first (`none` writes nothing). */
export const logLevels = ["debug", "info", "warning", "error", "none"] as const

// What a bearer token can carry (RFC 6750's b64token is narrower): visible ASCII, no space.
const bearerSafe = /^[\x21-\x7e]+$/

/**
 * The server's own settings (not the managed runtime configuration, which
 * lives in the store): where the database is, where to listen, the admin
 * token. Read from a JSON file, then overridden by the environment.
 */
export const ServerConfigSchema = z
  .object({
    /** `sqlite:<path>` or a plain path (SQLite), `postgres://…` (PostgreSQL), or `memory:` (nothing persists). */
    databaseUrl: z
      .string()
      .default("sqlite:./scanfleet.db")
      .superRefine((url, ctx) => {
        const refused = Database.check(url)
        if (refused) ctx.addIssue({ code: "custom", message: refused.message })
      }),
    host: z.string().min(1).default("127.0.0.1"),
    /** 0 picks a free port. */
    port: z.number().int().min(0).max(65_535).default(8080),
    /** Bearer token of `/v1/admin/*` and the dashboard: at least 16 characters, each visible ASCII (no space), so it can be sent as `Authorization: Bearer <token>`. */
    adminToken: z
      .string({ error: (i) => (i.input === undefined ? "required" : undefined) })
      .min(16, "must be at least 16 characters")
      .regex(bearerSafe, "must be visible ASCII characters without spaces (it is sent as Authorization: Bearer <token>), such as the output of openssl rand -hex 32"),
    /** How often the expiry sweeper looks for reservations past their assignment expiry. */
    sweepIntervalMs: z.number().int().min(10).max(3_600_000).default(1000),
    /** How long a stopping server waits for requests still in flight (their clients gone) before it closes the store, milliseconds. */
    shutdownGraceMs: z.number().int().min(0).max(600_000).default(30_000),
    /** Upper bound of a JSON request body other than a result, bytes. */
    maxBodyBytes: z.number().int().min(1024).max(16 * 1024 * 1024).default(256 * 1024),
    /**
     * The most request body bytes held while they are uploaded, over every request at once: a body
     * that would take the total past it is answered 503 `server_busy` with `Retry-After`. At least
     * a result's 1 MiB.
     */
    maxBodyBytesInFlight: z.number().int().min(1024 * 1024).max(64 * 1024 * 1024 * 1024).default(256 * 1024 * 1024),
    /** Connection pool size for PostgreSQL. */
    poolSize: z.number().int().min(1).max(200).default(10),
    /** PostgreSQL: run the hot statements as prepared statements; off behind a pooler that cannot carry them (PgBouncer in transaction mode before 1.21). */
    pgPrepare: z.boolean().default(true),
    /**
     * PostgreSQL: how long one statement may run, its lock waits included, before the database
     * cancels it and the request gets 503 `store_unavailable`; 0 for no limit. A statement with no
     * answer at all 10 s past it closes its connection (a database that stopped answering).
     */
    pgStatementTimeoutMs: z.number().int().min(0).max(3_600_000).default(30_000),
    /** The least severe log line written. */
    logLevel: z.enum(logLevels).default("info"),
    /** The secret the fleet key (devices fingerprint found secrets with it) is derived from; the admin token when absent. Never stored in the database. */
    findingsKey: z.string().min(16).optional(),
    /** Opt-in raw upload: 32 bytes as 64 hex digits; devices may then send secret values, sealed with AES-256-GCM before they are stored. Never stored in the database. */
    findingsRawKey: z.string().regex(/^[0-9a-fA-F]{64}$/, "must be 64 hex digits (32 bytes)").optional(),
    /** Where findings webhooks are POSTed (none when absent): an http(s) URL without credentials in it (`Webhooks.urlProblem`). */
    webhookUrl: z
      .string()
      .superRefine((u, ctx) => {
        const why = urlProblem(u)
        if (why !== undefined) ctx.addIssue({ code: "custom", message: why })
      })
      .optional(),
    /** The HMAC-SHA256 key of the webhook signature; required with webhookUrl. */
    webhookSecret: z.string().min(16).optional(),
    /** Tries per event before it goes to the dead-letter list. */
    webhookMaxTries: z.number().int().min(1).max(100).default(12),
    /** Per-attempt timeout, milliseconds. */
    webhookTimeoutMs: z.number().int().min(10).max(300_000).default(10_000),
    /** First retry delay, milliseconds; it doubles per try (jittered) up to webhookMaxDelayMs. With the defaults 12 tries span about 17 minutes. */
    webhookBaseDelayMs: z.number().int().min(1).max(600_000).default(1000),
    webhookMaxDelayMs: z.number().int().min(1).max(3_600_000).default(300_000),
    /** How often an idle webhook looks for new outbox events, milliseconds. */
    webhookPollMs: z.number().int().min(5).max(60_000).default(500),
    /** Log lines as JSON (one object a line) or laid out for people. */
    logFormat: z.enum(LogLine.formats as [LogLine.Format, ...Array<LogLine.Format>]).default("json")
  })
  .strict()
  .refine((c) => (c.webhookUrl === undefined) === (c.webhookSecret === undefined), { message: "webhookUrl and webhookSecret go together", path: ["webhookSecret"] })

/** The server's settings. */
export type ServerConfig = z.infer<typeof ServerConfigSchema>
/** Settings as written in a file or passed by a caller; defaults fill the rest. */
export type ServerConfigInput = z.input<typeof ServerConfigSchema>

/** The environment variables read, and the setting each one overrides. */
export const envVars = {
  SCANFLEET_DATABASE_URL: "databaseUrl",
  SCANFLEET_HOST: "host",
  SCANFLEET_PORT: "port",
  SCANFLEET_ADMIN_TOKEN: "adminToken",
  SCANFLEET_SWEEP_INTERVAL_MS: "sweepIntervalMs",
  SCANFLEET_POOL_SIZE: "poolSize",
  SCANFLEET_PG_PREPARE: "pgPrepare",
  SCANFLEET_PG_STATEMENT_TIMEOUT_MS: "pgStatementTimeoutMs",
  SCANFLEET_LOG_LEVEL: "logLevel",
  SCANFLEET_FINDINGS_KEY: "findingsKey",
  SCANFLEET_FINDINGS_RAW_KEY: "findingsRawKey",
  SCANFLEET_WEBHOOK_URL: "webhookUrl",
  SCANFLEET_WEBHOOK_SECRET: "webhookSecret",
  SCANFLEET_LOG_FORMAT: "logFormat"
} as const

/** The command-line flag of each setting (the CLI reads the same names). */
export const flagOf = (field: string): string => `--${field.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`).replace(/^database-url$/, "database")}`

/** The settings `serve` also takes as a flag (Cli.ts declares them); the others come from the environment or the settings file. */
export const flagged: ReadonlySet<string> = new Set(["databaseUrl", "logFormat", "logLevel", "host", "port", "adminToken", "sweepIntervalMs", "poolSize", "pgPrepare"])

/** Where a setting can be given, for messages: its flag where it has one, its environment variable where it has one, else the settings file. */
export const whereSet = (field: string): string => {
  const env = Object.entries(envVars).find(([, f]) => f === field)?.[0]
  const places = [...(flagged.has(field) ? [flagOf(field)] : []), ...(env ? [env] : [])]
  return places.length > 0 ? places.join(" or ") : `the settings file's "${field}"`
}

const numeric = new Set(["port", "sweepIntervalMs", "poolSize", "pgStatementTimeoutMs"])
const flags: Record<string, boolean> = { on: true, true: true, "1": true, off: false, false: false, "0": false }

/** A configuration that could not be read; `issues` name the fields. */
export class ServerConfigError extends Error {
  constructor(
    message: string,
    readonly issues: ReadonlyArray<{ readonly path: ReadonlyArray<string | number>; readonly message: string }>
  ) {
    super(message)
    this.name = "ServerConfigError"
  }
}

/** Validates settings given in code, filling the defaults. */
export const make = (input: ServerConfigInput): ServerConfig => {
  const parsed = ServerConfigSchema.safeParse(input)
  if (parsed.success) return parsed.data
  const issues = parsed.error.issues.map((i) => ({ path: i.path.map((k) => (typeof k === "symbol" ? String(k) : k)), message: i.message }))
  throw new ServerConfigError(
    `invalid server configuration: ${issues.map((i) => `${i.path.join(".") || "(root)"}${i.path.length === 1 ? ` (${whereSet(String(i.path[0]))})` : ""}: ${i.message}`).join("; ")}`,
    issues
  )
}

/**
 * Loads settings: the JSON file (when given, or `SCANFLEET_CONFIG`), then the
 * `SCANFLEET_*` environment variables on top.
 *
 * @example
 * const config = ServerConfig.load({ file: "scanfleet.json", env: process.env })
 */
export const load = (opts: { readonly file?: string | undefined; readonly env?: Record<string, string | undefined>; readonly overrides?: Partial<ServerConfigInput> }): ServerConfig => {
  const env = opts.env ?? {}
  const file = opts.file ?? env.SCANFLEET_CONFIG
  let fromFile: Record<string, unknown> = {}
  if (file) {
    let text: string
    try {
      text = readFileSync(file, "utf8")
    } catch (e) {
      throw new ServerConfigError(`cannot read configuration file ${file}: ${(e as Error).message}`, [])
    }
    try {
      const json: unknown = JSON.parse(text)
      if (typeof json !== "object" || json === null || Array.isArray(json)) throw new Error("the top level must be an object")
      fromFile = json as Record<string, unknown>
    } catch (e) {
      throw new ServerConfigError(`configuration file ${file} is not a JSON object: ${(e as Error).message}`, [])
    }
  }
  const fromEnv: Record<string, unknown> = {}
  for (const [name, field] of Object.entries(envVars)) {
    const v = env[name]
    if (v === undefined || v === "") continue
    fromEnv[field] = numeric.has(field) && /^\d+$/.test(v) ? Number(v) : field === "pgPrepare" && v.toLowerCase() in flags ? flags[v.toLowerCase()] : v
  }
  return make({ ...fromFile, ...fromEnv, ...opts.overrides } as ServerConfigInput)
}

/** The settings a running server was started with. */
export class Settings extends Context.Tag("@scanfleet/server-example/Settings")<Settings, ServerConfig>() {}
