import { CliConfig, Command, HelpDoc, ValidationError } from "@effect/cli"
import { levensteinDistance } from "@effect/cli/AutoCorrect"
import { NodeContext } from "@effect/platform-node"
import { Cause, Console, Data, Effect, Exit, Fiber, Layer, Logger, Option } from "effect"
import { LogLine } from "@scanfleet/core"

/**
 * How both scanfleet commands (`scanfleet-server`, `scanfleet-worker`) run
 * an `@effect/cli` command line: help and version on stdout with exit 0,
 * refusals on stderr with exit 2 and a suggestion, failures with exit 1,
 * SIGINT/SIGTERM interrupting the command (its finalizers run) and exit 0.
 */

/** Where a command writes. `isTTY` keeps colours for a terminal only. */
export interface Io {
  readonly out: (s: string) => void
  readonly err: (s: string) => void
  readonly isTTY?: boolean
}

/** The process's own stdout and stderr. */
export const processIo: Io = {
  out: (s) => process.stdout.write(s),
  err: (s) => process.stderr.write(s),
  isTTY: process.stdout.isTTY === true && !process.env.NO_COLOR
}

/** A command line that cannot be run as given (exit 2); the message says what to change. */
export class UsageError extends Data.TaggedError("UsageError")<{ readonly message: string }> {}

/** A command that ran and failed (exit 1, or `code`). */
export class CommandFailed extends Data.TaggedError("CommandFailed")<{ readonly message: string; readonly code?: number }> {}

/** What the runner needs to know about an application. */
export interface App<Name extends string, R, E, A> {
  readonly name: string
  readonly version: string
  readonly command: Command.Command<Name, R, E, A>
  /** What the command needs beyond the Node platform. */
  readonly layer?: Layer.Layer<R, never, NodeContext.NodeContext>
}

const ansi = /\x1b\[[0-9;]*m/g

/** The closest of `candidates` to `word`, when it is close enough to be a likely typo. */
export const closest = (word: string, candidates: Iterable<string>): string | undefined => {
  let best: { readonly c: string; readonly d: number } | undefined
  for (const c of candidates) {
    const d = levensteinDistance(word, c, CliConfig.defaultConfig)
    if (best === undefined || d < best.d) best = { c, d }
  }
  return best !== undefined && best.d <= Math.max(2, Math.floor(word.length / 3)) ? best.c : undefined
}

/** A command path ("device add") and the flags it takes. */
export interface Entry {
  readonly path: ReadonlyArray<string>
  readonly flags: ReadonlyArray<string>
}

const builtIns = ["--help", "-h", "--version", "--log-level", "--wizard", "--completions"]

/**
 * A command's help without @effect/cli's own section for a flag the command defines itself
 * (`serve --log-level`): @effect/cli lists both, and can hide its own flags only all together.
 * A section is a flag's usage line at the start of a line and the indented lines after it.
 */
export const withoutShadowedBuiltIns = (help: string): string => {
  const lines = help.split("\n")
  const flagOf = (line: string) => /^(?:\(-\w, )?(--[\w-]+)/.exec(line.replace(ansi, ""))?.[1]
  const starts = lines.flatMap((line, i) => (flagOf(line) === undefined ? [] : [i]))
  const sections = starts.map((start, k) => {
    // a section ends at the next flag's usage line or at the next line that is not indented (a heading)
    let end = start + 1
    while (end < lines.length && end !== starts[k + 1] && (lines[end] === "" || /^\s/.test(lines[end].replace(ansi, "")))) end++
    return { flag: flagOf(lines[start])!, start, end, builtIn: lines.slice(start, end).some((l) => builtInDescriptions.includes(l.replace(ansi, "").trim())) }
  })
  const dropped = sections.filter((x) => x.builtIn && sections.some((y) => y !== x && y.flag === x.flag && !y.builtIn))
  if (dropped.length === 0) return help
  return lines.filter((_, i) => !dropped.some((d) => i >= d.start && i < d.end)).join("\n")
}

// The descriptions @effect/cli gives its own flags that a command may also define.
const builtInDescriptions = ["Sets the minimum log level for a command."]

/** The commands and flags of a tree, read from the usage lines @effect/cli writes for it, so they are never listed twice. */
export const entries = <Name extends string, R, E, A>(command: Command.Command<Name, R, E, A>): ReadonlyArray<Entry> =>
  HelpDoc.toAnsiText(Command.getHelp(command, CliConfig.defaultConfig))
    .replace(ansi, "")
    .split("\n")
    .flatMap((line) => {
      const m = /^\s*- (.*)$/.exec(line)
      if (!m) return []
      // "- device add [--name text]   description": the usage, then the description after a wide gap.
      const usage = m[1].trim().split(/\s{2,}/)[0]
      const tokens = usage.split(/\s+/)
      const cut = tokens.findIndex((t) => /^[[(<-]/.test(t))
      return [{ path: cut === -1 ? tokens : tokens.slice(0, cut), flags: [...usage.matchAll(/--[\w-]+/g)].map((f) => f[0]) }]
    })

/**
 * The refusal of a mistyped command word or flag, or `undefined`.
 * `@effect/cli` refuses them too, but names the closest one only for some.
 */
export const refusal = (name: string, tree: ReadonlyArray<Entry>, argv: ReadonlyArray<string>): string | undefined => {
  const path: Array<string> = []
  let i = 0
  for (; i < argv.length && !argv[i].startsWith("-"); i++) {
    const next = [...new Set(tree.filter((e) => e.path.length > path.length && path.every((w, k) => e.path[k] === w)).map((e) => e.path[path.length]))]
    if (next.length === 0) break
    if (!next.includes(argv[i])) {
      const guess = closest(argv[i], next)
      const where = [name, ...path].join(" ")
      return `unknown command '${argv[i]}' for '${where}'${guess ? `; did you mean '${guess}'?` : ""} (one of: ${next.join(", ")}). Run '${where} --help' for usage.`
    }
    path.push(argv[i])
  }
  const here = tree.find((e) => e.path.length === path.length && e.path.every((w, k) => path[k] === w))
  if (!here) return undefined
  const known = [...here.flags, ...builtIns]
  for (; i < argv.length && argv[i] !== "--"; i++) {
    const flag = argv[i].split("=")[0]
    if (!flag.startsWith("-") || known.includes(flag)) continue
    const guess = closest(flag, here.flags)
    const where = [name, ...path].join(" ")
    return `unknown option '${flag}' for '${where}'${guess ? `; did you mean '${guess}'?` : "."} Run '${where} --help' for usage.`
  }
  return undefined
}

/**
 * `--flag -5` as `--flag=-5`: `@effect/cli` reads a value that starts with `-` as an option
 * of its own, so a negative number would be refused as an unknown option instead of
 * reaching the flag (whose own check then says what it takes). No flag name starts
 * with a digit, so nothing else is joined.
 */
export const joinNegativeValues = (argv: ReadonlyArray<string>): Array<string> => {
  const out: Array<string> = []
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    if (a === "--") return [...out, ...argv.slice(i)]
    if (a.startsWith("--") && !a.includes("=") && i + 1 < argv.length && /^-\d/.test(argv[i + 1])) out.push(`${a}=${argv[++i]}`)
    else out.push(a)
  }
  return out
}

/** The log layer of a command: the one schema (`LogLine`) on stderr, at `format`. */
export const logger = (format: LogLine.Format): Layer.Layer<never> => LogLine.toConsole("stderr", format)

/**
 * Runs `argv` (without `node` and the script) through the application and
 * resolves to the process exit code.
 */
export const run = async <Name extends string, R, E, A>(app: App<Name, R, E, A>, given: ReadonlyArray<string>, io: Io = processIo): Promise<number> => {
  const argv = joinNegativeValues(given)
  const refused = refusal(app.name, entries(app.command), argv)
  if (refused) {
    io.err(`${refused}\n`)
    return 2
  }
  const plain = (s: string) => (io.isTTY ? s : s.replace(ansi, ""))
  const write = (sink: (s: string) => void) => (...args: ReadonlyArray<unknown>) =>
    Effect.sync(() => sink(`${plain(withoutShadowedBuiltIns(args.map((a) => (typeof a === "string" ? a : String(a))).join(" ")))}\n`))
  const cli = Command.run(app.command, { name: app.name, version: app.version })
  const program = Effect.consoleWith((base) =>
    cli(["node", app.name, ...argv]).pipe(Effect.withConsole({ ...base, log: write(io.out), info: write(io.out), error: write(io.err), warn: write(io.err) }))
  ).pipe(
    Effect.provide(Layer.provideMerge(app.layer ?? (Layer.empty as unknown as Layer.Layer<R, never, NodeContext.NodeContext>), NodeContext.layer)),
    Effect.provide(logger("json"))
  ) as Effect.Effect<void, E | ValidationError.ValidationError>
  const fiber = Effect.runFork(program)
  let signalled = false
  const onSignal = () => {
    signalled = true
    void Effect.runPromise(Fiber.interrupt(fiber))
  }
  process.on("SIGINT", onSignal)
  process.on("SIGTERM", onSignal)
  const exit = await Effect.runPromise(Fiber.await(fiber))
  process.off("SIGINT", onSignal)
  process.off("SIGTERM", onSignal)
  if (Exit.isSuccess(exit)) return 0
  if (Cause.isInterruptedOnly(exit.cause)) return signalled ? 0 : 1
  const failure = Cause.failureOption(exit.cause)
  if (Option.isSome(failure)) {
    const e: unknown = failure.value
    // @effect/cli has already printed its own refusal (with "did you mean" for a mistyped flag).
    if (ValidationError.isValidationError(e)) return 2
    if (e instanceof UsageError) {
      io.err(`${app.name}: ${e.message}\nRun '${app.name} --help' for usage.\n`)
      return 2
    }
    if (e instanceof CommandFailed) {
      io.err(`${app.name}: ${e.message}\n`)
      return e.code ?? 1
    }
    io.err(`${app.name}: failed: ${e instanceof Error ? e.message : String(e)}\n`)
    return 1
  }
  io.err(`${app.name}: failed: ${Cause.pretty(exit.cause)}\n`)
  return 1
}

/** Fails with a `UsageError` naming the flag and its environment variable when a required setting is absent. */
export const required = <A>(value: Option.Option<A>, flag: string, env?: string): Effect.Effect<A, UsageError> =>
  Option.match(value, {
    onNone: () => Effect.fail(new UsageError({ message: `missing ${flag}${env ? ` (or set ${env})` : ""}` })),
    onSome: Effect.succeed
  })

/** Writes a line to the command's stdout (through the Console the runner installed). */
export const print = (s: string): Effect.Effect<void> => Console.log(s)

/** Writes a line to the command's stderr. */
export const printError = (s: string): Effect.Effect<void> => Console.error(s)
