import { Cause, Effect, FiberRef, HashMap, HashSet, Inspectable, Layer, List, Logger, type LogLevel } from "effect"

/**
 * The one log schema of every scanfleet program (server, worker, demo): one
 * JSON object a line, `{"time":"<ISO 8601>","level":"info","message":"…", …fields}`,
 * or the same entry laid out for people (`pretty`). The formatter is pure;
 * where the line goes (stdout, stderr) is the caller's choice.
 */

/** The two layouts: JSON lines for machines, `pretty` for people at a terminal. */
export type Format = "json" | "pretty"

/** The layouts, for option parsers. */
export const formats: ReadonlyArray<Format> = ["json", "pretty"]

/** Severity, lower case. */
export type Level = "trace" | "debug" | "info" | "warning" | "error" | "fatal"

/** One log entry. Field names `time`, `level` and `message` are reserved; such a field is written with a leading underscore. */
export interface Entry {
  readonly time: number
  readonly level: Level
  readonly message: string
  readonly fields: Readonly<Record<string, unknown>>
}

const reserved = new Set(["time", "level", "message"])

/** The entry as one line (without the newline). */
export const format = (entry: Entry, layout: Format): string => {
  if (layout === "json") {
    const out: Record<string, unknown> = { time: new Date(entry.time).toISOString(), level: entry.level, message: entry.message }
    for (const [k, v] of Object.entries(entry.fields)) out[reserved.has(k) ? `_${k}` : k] = v
    return inert(JSON.stringify(out, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v instanceof Error ? { name: v.name, message: v.message } : v)))
  }
  const fields = Object.entries(entry.fields)
    .map(([k, v]) => `${k}=${typeof v === "string" && !/\s|"/.test(v) && !unsafe.test(v) ? v : inert(JSON.stringify(v) ?? String(v))}`)
    .join(" ")
  return `${new Date(entry.time).toISOString().slice(11, 23)} ${entry.level.toUpperCase().padEnd(7)} ${entry.message.replace(unsafeAll, (c) => (c === "\n" || c === "\t" ? c : escaped(c)))}${fields ? `  ${fields}` : ""}`
}

// What a terminal or a log reader may act on, beyond the C0 controls JSON escapes: DEL and the
// C1 controls, line and paragraph separators, bidirectional controls.
const unsafe = /[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/
const unsafeAll = new RegExp(unsafe.source, "g")

const escaped = (c: string) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`

// JSON text with every such character as a \u escape: the same JSON value, inert on a terminal.
const inert = (json: string): string => json.replace(unsafeAll, escaped)

/** Reads a JSON log line back (the demo and tests read logs); `null` for anything that is not one. */
export const parse = (line: string): Entry | null => {
  try {
    const j: unknown = JSON.parse(line)
    if (typeof j !== "object" || j === null) return null
    const { time, level, message, ...fields } = j as Record<string, unknown>
    if (typeof time !== "string" || typeof level !== "string" || typeof message !== "string") return null
    const t = Date.parse(time)
    return Number.isNaN(t) ? null : { time: t, level: level as Level, message, fields }
  } catch {
    return null
  }
}

const levelOf = (l: LogLevel.LogLevel): Level =>
  l._tag === "Trace" || l._tag === "All" ? "trace" : l._tag === "Debug" ? "debug" : l._tag === "Info" ? "info" : l._tag === "Warning" ? "warning" : l._tag === "Error" ? "error" : "fatal"

const text = (u: unknown): string => (typeof u === "string" ? u : Inspectable.toStringUnknown(u))

/**
 * An Effect logger producing lines of this schema: log annotations and spans
 * become fields, a cause becomes the `cause` field. Pair it with a sink, for
 * example `Logger.withConsoleError(LogLine.logger("json"))`, or use `toConsole`.
 *
 * @example
 * const live = Logger.replace(Logger.defaultLogger, Logger.withConsoleError(LogLine.logger("pretty")))
 */
export const logger = (layout: Format): Logger.Logger<unknown, string> =>
  Logger.make(({ annotations, cause, date, logLevel, message, spans }) => {
    const parts = Array.isArray(message) ? message : [message]
    const fields: Record<string, unknown> = {}
    for (const [k, v] of HashMap.toEntries(annotations)) fields[k] = v
    for (const s of List.toArray(spans)) fields[`${s.label}Ms`] = date.getTime() - s.startTime
    if (!Cause.isEmpty(cause)) fields.cause = Cause.pretty(cause, { renderErrorCause: true })
    return format({ time: date.getTime(), level: levelOf(logLevel), message: parts.map(text).join(" "), fields }, layout)
  })

/** The writers `toConsole` installs, one per stream and format, so installing one twice adds nothing. */
const writers = {
  stdout: { json: Logger.withConsoleLog(logger("json")), pretty: Logger.withConsoleLog(logger("pretty")) },
  stderr: { json: Logger.withConsoleError(logger("json")), pretty: Logger.withConsoleError(logger("pretty")) }
} as const
const ours: ReadonlySet<Logger.Logger<unknown, unknown>> = new Set<Logger.Logger<unknown, unknown>>(Object.values(writers).flatMap((w) => [w.json, w.pretty]))

/**
 * Writes this schema's lines in `layout` to the console's `stream`, in place of
 * Effect's default logger and of any writer this function installed before
 * (the command line's, the server's), so each line is written once however
 * many layers ask for a writer. Loggers added by the application stay.
 *
 * @example
 * Effect.logInfo("ready").pipe(Effect.provide(LogLine.toConsole("stderr", "pretty")))
 */
export const toConsole = (stream: "stdout" | "stderr", layout: Format): Layer.Layer<never> =>
  Layer.scopedDiscard(
    Effect.locallyScopedWith(FiberRef.currentLoggers, (installed) =>
      HashSet.add(
        HashSet.filter(installed, (l) => l !== Logger.defaultLogger && !ours.has(l)),
        writers[stream][layout]
      )
    )
  )
