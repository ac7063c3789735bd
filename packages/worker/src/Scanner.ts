import { type Assignment, Findings, PhaseModel, Source, WorkerApi } from "@scanfleet/core"
import { Data, Effect } from "effect"
import { accessSync, constants, statSync } from "node:fs"
import { delimiter, isAbsolute, join } from "node:path"
import { fileURLToPath } from "node:url"
import { z } from "zod"
import { entry } from "./internal/Entries.js"

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

/**
 * One argument template. Replaced per target: `{identity}`, `{source}`,
 * `{workDir}`, `{targetId}`; `{gitUrl}` (the clone URL on the target's own
 * host, see `hosts`), `{hfKind}` and `{hfName}` (a HuggingFace identity
 * `spaces/acme/demo` gives `space` and `acme/demo`), `{image}` (a DockerHub
 * identity `acme/app:1.0@sha256:…` gives `acme/app@sha256:…`, the digest
 * that was discovered).
 */
const Args = z.array(z.string().max(4096)).max(256)

/** A scanner run as a command. */
export const CommandSpecSchema = z
  .object({
    kind: z.literal("command"),
    name: z.string().min(1).max(100),
    command: z.string().min(1),
    /** Arguments, or arguments per source. */
    args: z.union([Args, z.partialRecord(Source.SourceSchema, Args)]),
    /** Optional data acquisition step run before the scanner (for example a clone). */
    acquire: z.object({ command: z.string().min(1), args: Args }).strict().optional(),
    /** Exit code → outcome. Codes missing from the table give `otherwise`. */
    exitCodes: z.record(z.string().regex(/^\d+$/), ScannerOutcomeSchema),
    otherwise: ScannerOutcomeSchema.default("scan_error"),
    stop: StopSchema.default("SIGTERM"),
    /** Extra environment for the scanner (it also inherits the worker's, where credentials belong). */
    env: z.record(z.string(), z.string()).optional(),
    /** Web roots of self-hosted sources for `{gitUrl}` (default `https://github.com`, `https://gitlab.com`). */
    hosts: z.partialRecord(Source.SourceSchema, z.string().url()).optional(),
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

/** The scan-stage phases a runner may enter itself (the unit enters `permit_wait` and `preparing` before the runner starts). */
export const runnerPhases = PhaseModel.scanStage.filter((p): p is Exclude<(typeof PhaseModel.scanStage)[number], "permit_wait" | "preparing"> => p !== "permit_wait" && p !== "preparing")
/** A phase a runner may enter. */
export type RunnerPhase = (typeof runnerPhases)[number]

/** What a runner module's function receives. */
export interface RunnerContext {
  readonly target: { readonly id: number; readonly source: Source.Source; readonly identity: string }
  /** A private directory, removed by the controller when the scan stage ends. */
  readonly workDir: string
  /** The target-scan deadline on this device's clock (the watchdog enforces it; this is information). */
  readonly scanDeadline: number
  readonly options: unknown
  /**
   * Reports entering a later phase of the scan stage. It accepts the phases
   * `runnerPhases` lists, core's scan-stage phases after `preparing`, in
   * their order: `acquiring` (fetching the target), `scanning`, `filtering`,
   * `cleanup`, `staging`. A phase may be skipped; an earlier or repeated one
   * is ignored, because the timeline only moves forward.
   */
  readonly enter: (phase: RunnerPhase) => void
  /** Appends a line to the bounded log; lines logged before a timeout are kept in its result. */
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

/** What the execution unit cut from a scanner's output to stay within its limits (see `UnitProtocol.OutputLimits`). */
export const CutSchema = z
  .object({
    /** Findings produced but not kept (the count or byte limit was reached). */
    findings: z.number().int().min(0),
    /** Stdout lines longer than the line limit, dropped unread. */
    longLines: z.number().int().min(0),
    /** Bytes the scanner wrote to stdout in all. */
    stdoutBytes: z.number().int().min(0),
    /** Stdout bytes beyond the stdout file's limit, counted but not stored. */
    unstoredBytes: z.number().int().min(0),
    /** Log characters dropped from the head (the tail is kept). */
    logChars: z.number().int().min(0)
  })
  .strict()
/** What was cut. */
export type Cut = z.infer<typeof CutSchema>

/** What the execution unit staged: a raw exit for commands, an outcome for modules. */
export const StagedSchema = z.discriminatedUnion("kind", [
  z
    .object({
      kind: z.literal("exit"),
      code: z.number().int().nullable(),
      signal: z.string().nullable(),
      findings: z.array(WorkerApi.Finding),
      malformed: z.number().int().min(0),
      log: z.string(),
      cut: CutSchema.optional()
    })
    .strict(),
  z.object({ kind: z.literal("outcome"), outcome: ScannerOutcomeSchema, findings: z.array(WorkerApi.Finding), log: z.string(), cut: CutSchema.optional() }).strict()
])
/** A staged scan result. */
export type Staged = z.infer<typeof StagedSchema>

/** Maps a raw exit to a typed outcome with the scanner's table; a signal death is a scan error. */
export const classify = (spec: ParsedSpec, staged: Staged): Assignment.Outcome => {
  if (staged.kind === "outcome") return staged.outcome
  if (spec.kind !== "command" || staged.code === null) return "scan_error"
  return spec.exitCodes[String(staged.code)] ?? spec.otherwise
}

/** The values a template is expanded with. */
export interface Vars {
  readonly source: Source.Source
  readonly identity: string
  readonly workDir: string
  readonly targetId: number
}

/** Default web roots of the git sources, for `{gitUrl}`. */
export const defaultHosts: Readonly<Partial<Record<Source.Source, string>>> = { github: "https://github.com", gitlab: "https://gitlab.com" }

/**
 * The web root of a git source from its API base URL as a discovery client
 * takes it: GitHub's `https://api.github.com` is `https://github.com`, a
 * GitHub Enterprise `https://ghe.example.com/api/v3` is
 * `https://ghe.example.com`; a GitLab `baseUrl` is already the instance root
 * (a trailing `/api/v4` is dropped).
 */
export const gitHost = (source: "github" | "gitlab", baseUrl: string): string => {
  const u = new URL(baseUrl)
  if (source === "github" && u.hostname === "api.github.com") return "https://github.com"
  const path = u.pathname.replace(/\/+$/, "").replace(source === "github" ? /\/api\/v3$/ : /\/api\/v4$/, "")
  return `${u.protocol}//${u.host}${path}`
}

const hfKinds: Record<string, string> = { models: "model", datasets: "dataset", spaces: "space" }

/** The per-target template values: see the argument template. */
export const templateValues = (v: Vars, hosts: Readonly<Partial<Record<Source.Source, string>>> = {}): Readonly<Record<string, string>> => {
  const [prefix, ...rest] = v.identity.split("/")
  const hf = hfKinds[prefix] !== undefined && rest.length > 0 ? { kind: hfKinds[prefix], name: rest.join("/") } : { kind: "model", name: v.identity }
  const host = (hosts[v.source] ?? defaultHosts[v.source] ?? "").replace(/\/+$/, "")
  // A DockerHub identity is `namespace/repository:tag@digest`; the digest pins exactly what was discovered.
  const at = v.identity.indexOf("@")
  const image = at < 0 ? v.identity : `${v.identity.slice(0, at).replace(/:[^/:]*$/, "")}${v.identity.slice(at)}`
  return {
    identity: v.identity,
    source: v.source,
    workDir: v.workDir,
    targetId: String(v.targetId),
    gitUrl: `${host}/${v.identity}.git`,
    hfKind: hf.kind,
    hfName: hf.name,
    image
  }
}

/** True when a command scanner has a command line for the source (a module runner takes every source). */
export const supports = (spec: ParsedSpec, source: Source.Source): boolean =>
  spec.kind !== "command" || Array.isArray(spec.args) || (spec.args as Partial<Record<Source.Source, unknown>>)[source] !== undefined

/** Expands an argument template for one target (an empty list for a source without one). */
export const expand = (args: CommandSpec["args"], v: Vars, hosts?: Readonly<Partial<Record<Source.Source, string>>>): ReadonlyArray<string> => {
  const list = Array.isArray(args) ? args : (args as Partial<Record<Source.Source, ReadonlyArray<string>>>)[v.source]
  if (list === undefined) return []
  const values = templateValues(v, hosts)
  return list.map((a) => a.replace(/\{(\w+)\}/g, (whole, name: string) => values[name] ?? whole))
}

/** The scanner's own argv for one target, as the unit runs it. */
export const commandLine = (spec: CommandSpecParsed, v: Vars): ReadonlyArray<string> => [spec.command, ...expand(spec.args, v, spec.hosts)]

/** A parsed command scanner. */
export type CommandSpecParsed = z.output<typeof CommandSpecSchema>

/** A command a scanner needs is not on this device. */
export class ScannerMissing extends Data.TaggedError("ScannerMissing")<{
  readonly scanner: string
  readonly command: string
  readonly message: string
}> {}

/** Finds a command as the kernel would: a path with a slash as it is, a bare name on PATH; null when nothing executable is there. */
export const which = (command: string, path: string = process.env.PATH ?? ""): string | null => {
  const executable = (file: string) => {
    try {
      accessSync(file, constants.X_OK)
      return statSync(file).isFile()
    } catch {
      return false
    }
  }
  if (command.includes("/")) return executable(command) ? command : null
  for (const dir of path.split(delimiter)) {
    if (dir === "") continue
    const file = join(dir, command)
    if (executable(file)) return isAbsolute(file) ? file : join(process.cwd(), file)
  }
  return null
}

/** Fails when a command the scanner runs (its own, or its acquisition step's) cannot be found, naming it. */
export const requireBinaries = (spec: ParsedSpec, path?: string): Effect.Effect<void, ScannerMissing> =>
  Effect.suspend(() => {
    if (spec.kind !== "command") return Effect.void
    for (const command of [spec.command, ...(spec.acquire ? [spec.acquire.command] : [])])
      if (which(command, path) === null)
        return Effect.fail(
          new ScannerMissing({
            scanner: spec.name,
            command,
            message: `the ${spec.name} scanner needs "${command}", which is ${command.includes("/") ? "not an executable file" : "not on PATH"}; install it or point the spec's command at it`
          })
        )
    return Effect.void
  })

/** Describes a command scanner. */
export const command = (spec: Omit<CommandSpec, "kind">): ParsedSpec => CommandSpecSchema.parse({ kind: "command", ...spec })

/** Describes a module scanner; `module` is a path or a URL (for example `new URL("./scan.js", import.meta.url)`). */
export const runnerModule = (spec: Omit<ModuleSpec, "kind" | "module"> & { readonly module: string | URL }): ParsedSpec =>
  ModuleSpecSchema.parse({
    kind: "module",
    ...spec,
    module: spec.module instanceof URL ? fileURLToPath(spec.module) : spec.module.startsWith("file:") ? fileURLToPath(spec.module) : spec.module
  })

/** Where self-hosted sources live, for the presets. */
export interface PresetHosts {
  /** GitHub's API base URL as the discovery client takes it (default `https://api.github.com`). */
  readonly githubBaseUrl?: string
  /** The GitLab instance root as the discovery client takes it (default `https://gitlab.com`). */
  readonly gitlabBaseUrl?: string
}

const presetHosts = (opts: PresetHosts): Partial<Record<Source.Source, string>> => ({
  ...(opts.githubBaseUrl !== undefined ? { github: gitHost("github", opts.githubBaseUrl) } : {}),
  ...(opts.gitlabBaseUrl !== undefined ? { gitlab: gitHost("gitlab", opts.gitlabBaseUrl) } : {})
})

/**
 * TruffleHog. Per source: `git <clone URL on the target's own host>` for
 * GitHub and GitLab; `huggingface --model=|--space=|--dataset=<name>` chosen
 * from the identity's kind (`--endpoint=` when the Hub is self-hosted);
 * `docker --image=<repository@digest>` for DockerHub. Always `--json
 * --no-update --fail`: with `--fail` it exits 183 when it found results and
 * 0 when it found none; anything else is an error. Credentials come from the
 * worker's environment, never the command line: `HUGGINGFACE_TOKEN`,
 * `DOCKER_TOKEN`, and for private git repositories git's own
 * `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_0=http.extraHeader`/`GIT_CONFIG_VALUE_0`.
 * It treats SIGTERM as "restart", so the watchdog goes straight to SIGKILL.
 */
export const trufflehog = (
  opts: PresetHosts & { readonly command?: string; readonly extraArgs?: ReadonlyArray<string>; readonly huggingfaceEndpoint?: string } = {}
): ParsedSpec => {
  const common = ["--json", "--no-update", "--fail", ...(opts.extraArgs ?? [])]
  const hosts = presetHosts(opts)
  return command({
    name: "trufflehog",
    command: opts.command ?? "trufflehog",
    args: {
      github: ["git", "{gitUrl}", ...common],
      gitlab: ["git", "{gitUrl}", ...common],
      huggingface: ["huggingface", ...(opts.huggingfaceEndpoint !== undefined ? [`--endpoint=${opts.huggingfaceEndpoint}`] : []), "--{hfKind}={hfName}", ...common],
      dockerhub: ["docker", "--image={image}", ...common]
    },
    exitCodes: { "0": "clean", "183": "findings" },
    otherwise: "scan_error",
    stop: "SIGKILL",
    ...(Object.keys(hosts).length > 0 ? { hosts } : {})
  })
}

/** The exit code the gitleaks preset asks for when it found leaks (its own default, 1, is also its error code). */
export const gitleaksFindingsExit = 42

/** The report template that makes gitleaks print one JSON object per finding and line. */
export const gitleaksTemplate = (): string => fileURLToPath(new URL("../presets/gitleaks-jsonl.tmpl", import.meta.url))

/**
 * gitleaks, for the git sources (GitHub and GitLab, on the target's own
 * host). The acquisition step clones the repository into the work folder
 * (`git clone --quiet -- <URL> <workDir>/repo`), then `gitleaks git` scans
 * its history, printing each finding as a JSON line through the packaged
 * report template. Exit codes: 0 none found, 42 found (`--exit-code=42`;
 * its default, 1, is also what it exits with on an error), 1 error, 126 an
 * unknown flag (usage). Other sources have no command line: their targets
 * end `unsupported`.
 */
export const gitleaks = (opts: PresetHosts & { readonly command?: string; readonly git?: string; readonly extraArgs?: ReadonlyArray<string> } = {}): ParsedSpec => {
  const scan = [
    "git",
    "--no-banner",
    "--log-level=warn",
    `--exit-code=${gitleaksFindingsExit}`,
    "--report-format=template",
    `--report-template=${gitleaksTemplate()}`,
    "--report-path=-",
    ...(opts.extraArgs ?? []),
    "{workDir}/repo"
  ]
  const hosts = presetHosts(opts)
  return command({
    name: "gitleaks",
    command: opts.command ?? "gitleaks",
    acquire: { command: opts.git ?? "git", args: ["clone", "--quiet", "--", "{gitUrl}", "{workDir}/repo"] },
    args: { github: scan, gitlab: scan },
    exitCodes: { "0": "clean", [String(gitleaksFindingsExit)]: "findings", "1": "scan_error", "126": "usage" },
    otherwise: "scan_error",
    stop: "SIGTERM",
    ...(Object.keys(hosts).length > 0 ? { hosts } : {})
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
      entry("demo-scanner"),
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
