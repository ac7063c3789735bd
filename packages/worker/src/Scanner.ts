import { Assignment, Findings, Source, WorkerApi } from "@scanfleet/core"
import { fileURLToPath } from "node:url"
import { z } from "zod"

/**
 * Scanner plug-ins. A scanner is described by a serialisable spec, because it
 * runs inside the execution unit (a child process), not in the controller:
 * either a command template run with execa, or a module exporting a runner
 * function. Each spec carries its exit-code table: an exit code means nothing
 * until the scanner says what it means.
 */

/** Outcomes a scanner itself can report (the watchdog alone decides `killed_at_deadline`). */
export const scannerOutcomes = ["clean", "findings", "scan_error", "unsupported", "usage"] as const
/** An outcome a scanner can report. */
export type ScannerOutcome = (typeof scannerOutcomes)[number]
const ScannerOutcomeSchema = z.enum(scannerOutcomes)

/** How the watchdog stops the scanner's group: SIGTERM then SIGKILL, or SIGKILL only. */
export const StopSchema = z.enum(["SIGTERM", "SIGKILL"])

/** One argument template: `{identity}`, `{source}`, `{workDir}` and `{targetId}` are replaced. */
const Args = z.array(z.string().max(4096)).max(256)

/** A scanner run as a command. */
export const CommandSpecSchema = z
  .object({
    kind: z.literal("command"),
    name: z.string().min(1).max(100),
    command: z.string().min(1),
    /** Arguments, or arguments per source. */
    args: z.union([Args, z.record(Source.SourceSchema, Args)]),
    /** Optional data acquisition step run before the scanner (for example a clone). */
    acquire: z.object({ command: z.string().min(1), args: Args }).strict().optional(),
    /** Exit code → outcome. Codes missing from the table give `otherwise`. */
    exitCodes: z.record(z.string().regex(/^\d+$/), ScannerOutcomeSchema),
    otherwise: ScannerOutcomeSchema.default("scan_error"),
    stop: StopSchema.default("SIGTERM"),
    env: z.record(z.string(), z.string()).optional(),
    /** Which output fields hold secrets and where the detector, file and line are (the preset's by name when absent); see Redaction. */
    findings: Findings.FieldMapSchema.optional()
  })
  .strict()
/** A command scanner. */
export type CommandSpec = z.input<typeof CommandSpecSchema>

/** A scanner written in TypeScript (compiled to a module Node can import). */
export const ModuleSpecSchema = z
  .object({
    kind: z.literal("module"),
    name: z.string().min(1).max(100),
    /** Absolute path or file URL of the module. */
    module: z.string().min(1),
    exportName: z.string().default("default"),
    /** JSON options handed to the runner as `ctx.options`. */
    options: z.unknown().optional(),
    stop: StopSchema.default("SIGTERM"),
    /** Which fields of the runner's findings hold secrets (see Redaction). */
    findings: Findings.FieldMapSchema.optional()
  })
  .strict()
/** A module scanner. */
export type ModuleSpec = z.input<typeof ModuleSpecSchema>

/** Either kind of scanner. */
export const SpecSchema = z.discriminatedUnion("kind", [CommandSpecSchema, ModuleSpecSchema])
/** A scanner spec as written by a user. */
export type Spec = z.input<typeof SpecSchema>
/** A scanner spec after parsing (defaults filled in). */
export type ParsedSpec = z.output<typeof SpecSchema>

/** One finding: a JSON object. */
export type Finding = z.infer<typeof WorkerApi.Finding>

/** What a runner module's function receives. */
export interface RunnerContext {
  readonly target: { readonly id: number; readonly source: Source.Source; readonly identity: string }
  /** A private directory, removed by the controller when the scan stage ends. */
  readonly workDir: string
  /** The target-scan deadline on this device's clock (the watchdog enforces it; this is information). */
  readonly scanDeadline: number
  readonly options: unknown
  /** Reports entering a later scan-stage phase; earlier or repeated phases are ignored. */
  readonly enter: (phase: "acquiring" | "scanning" | "filtering" | "cleanup" | "staging") => void
  /** Appends a line to the bounded log. */
  readonly log: (line: string) => void
}

/** What a runner module's function returns. */
export interface RunnerResult {
  readonly outcome: ScannerOutcome
  readonly findings: ReadonlyArray<Finding>
  readonly log?: string
}

/** The function a runner module exports. */
export type RunnerFunction = (ctx: RunnerContext) => Promise<RunnerResult>

/** Types a runner function (identity at run time). */
export const defineRunner = (fn: RunnerFunction): RunnerFunction => fn

/** What the execution unit staged: a raw exit for commands, an outcome for modules. */
export const StagedSchema = z.discriminatedUnion("kind", [
  z
    .object({
      kind: z.literal("exit"),
      code: z.number().int().nullable(),
      signal: z.string().nullable(),
      findings: z.array(WorkerApi.Finding),
      malformed: z.number().int().min(0),
      log: z.string()
    })
    .strict(),
  z.object({ kind: z.literal("outcome"), outcome: ScannerOutcomeSchema, findings: z.array(WorkerApi.Finding), log: z.string() }).strict()
])
/** A staged scan result. */
export type Staged = z.infer<typeof StagedSchema>

/** Maps a raw exit to a typed outcome with the scanner's table; a signal death is a scan error. */
export const classify = (spec: ParsedSpec, staged: Staged): Assignment.Outcome => {
  if (staged.kind === "outcome") return staged.outcome
  if (spec.kind !== "command" || staged.code === null) return "scan_error"
  return spec.exitCodes[String(staged.code)] ?? spec.otherwise
}

/** Expands the argument template of a command scanner for one target. */
export const expand = (
  args: CommandSpec["args"],
  v: { readonly source: Source.Source; readonly identity: string; readonly workDir: string; readonly targetId: number }
): ReadonlyArray<string> => {
  const list = Array.isArray(args) ? args : (args as Record<string, ReadonlyArray<string>>)[v.source]
  if (list === undefined) return []
  return list.map((a) =>
    a.replaceAll("{identity}", v.identity).replaceAll("{source}", v.source).replaceAll("{workDir}", v.workDir).replaceAll("{targetId}", String(v.targetId))
  )
}

/** Describes a command scanner. */
export const command = (spec: Omit<CommandSpec, "kind">): ParsedSpec => CommandSpecSchema.parse({ kind: "command", ...spec })

/** Describes a module scanner; `module` is a path or a URL (for example `new URL("./scan.js", import.meta.url)`). */
export const runnerModule = (spec: Omit<ModuleSpec, "kind" | "module"> & { readonly module: string | URL }): ParsedSpec =>
  ModuleSpecSchema.parse({
    kind: "module",
    ...spec,
    module: spec.module instanceof URL ? fileURLToPath(spec.module) : spec.module.startsWith("file:") ? fileURLToPath(spec.module) : spec.module
  })

/**
 * trufflehog: `--fail` makes it exit 183 when it found secrets and 0 when it
 * found none; anything else is an error. It treats SIGTERM as "restart", so
 * the watchdog goes straight to SIGKILL.
 */
export const trufflehog = (opts: { readonly command?: string; readonly extraArgs?: ReadonlyArray<string> } = {}): ParsedSpec => {
  const common = ["--json", "--no-update", "--fail", ...(opts.extraArgs ?? [])]
  return command({
    name: "trufflehog",
    command: opts.command ?? "trufflehog",
    args: {
      github: ["git", "https://github.com/{identity}.git", ...common],
      gitlab: ["git", "https://gitlab.com/{identity}.git", ...common],
      huggingface: ["huggingface", "--model", "{identity}", ...common],
      dockerhub: ["docker", "--image", "{identity}", ...common]
    },
    exitCodes: { "0": "clean", "183": "findings" },
    otherwise: "scan_error",
    stop: "SIGKILL"
  })
}

/** The exit codes of the built-in demo scanner. */
export const demoExitCodes = { "0": "clean", "3": "findings", "2": "usage", "4": "unsupported" } as const

/**
 * The built-in demo scanner: a Node script that derives findings from the
 * identity (same identity, same findings) after a delay. Identities that
 * contain `slowMarker` sleep `slowDelayMs` instead, so a demo can make one
 * target overrun its target-scan deadline.
 */
export const demo = (opts: { readonly delayMs?: number; readonly slowMarker?: string; readonly slowDelayMs?: number } = {}): ParsedSpec =>
  command({
    name: "demo",
    command: process.execPath,
    args: [
      fileURLToPath(new URL("../runtime/demo-scanner.mjs", import.meta.url)),
      "--identity",
      "{identity}",
      "--source",
      "{source}",
      "--delay-ms",
      String(opts.delayMs ?? 200),
      "--slow-marker",
      opts.slowMarker ?? "slow",
      "--slow-delay-ms",
      String(opts.slowDelayMs ?? 3_600_000)
    ],
    exitCodes: { ...demoExitCodes },
    otherwise: "scan_error",
    stop: "SIGTERM"
  })
