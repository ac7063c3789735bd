import { describe, expect, it, vi } from "@effect/vitest"
import { Effect, type Layer, Logger } from "effect"
import { LogLine } from "@scanfleet/core"

/** Runs one log call under `layers` (outermost first) and returns what each console stream was given. */
const run = (layers: ReadonlyArray<Layer.Layer<never>>) => {
  const out: Array<string> = []
  const err: Array<string> = []
  const log = vi.spyOn(console, "log").mockImplementation((...args: Array<unknown>) => void out.push(args.map(String).join(" ")))
  const error = vi.spyOn(console, "error").mockImplementation((...args: Array<unknown>) => void err.push(args.map(String).join(" ")))
  try {
    const inner = Effect.logInfo("once").pipe(Effect.annotateLogs({ n: 1 }))
    Effect.runSync(layers.reduceRight((e: Effect.Effect<void>, layer) => Effect.provide(e, layer), inner))
  } finally {
    log.mockRestore()
    error.mockRestore()
  }
  return { out, err }
}

describe("LogLine.toConsole", () => {
  it("a writer installed by nested layers (the command line's, then the server's twice) writes each line once, on the stream and in the format asked last", () => {
    const c = run([LogLine.toConsole("stderr", "json"), LogLine.toConsole("stdout", "json"), LogLine.toConsole("stdout", "json")])
    expect(c.out).toHaveLength(1)
    expect(c.err).toEqual([])
    expect(JSON.parse(c.out[0])).toMatchObject({ level: "info", message: "once", n: 1 })
  })

  it("a writer in another format replaces the first instead of adding to it", () => {
    const c = run([LogLine.toConsole("stderr", "json"), LogLine.toConsole("stderr", "pretty")])
    expect(c.out).toEqual([])
    expect(c.err).toHaveLength(1)
    expect(c.err[0]).toMatch(/INFO +once +n=1/)
  })

  it("a logger the application added stays beside the writer, and Effect's default logger goes", () => {
    const seen: Array<unknown> = []
    const c = run([Logger.add(Logger.make(({ message }) => void seen.push(message))), LogLine.toConsole("stdout", "json")])
    expect(c.out).toHaveLength(1)
    expect(c.err).toEqual([])
    expect(seen).toHaveLength(1)
  })
})

describe("LogLine.format", () => {
  // ESC (a terminal's escape sequences), BEL, DEL, C1 controls (U+009B is CSI), a line separator and a bidirectional override
  const hostile = "dev\u001b]0;pwned\u0007\u001b[2J\u007f\u009b31m\u2028\u202e"
  const entry: LogLine.Entry = { time: 0, level: "info", message: `registered ${hostile}`, fields: { name: hostile, plain: "scanner-1" } }

  it("no line in either format carries a character a terminal or log reader acts on (C0, DEL, C1, line separators, bidirectional controls), and each reads back as the same value", () => {
    for (const layout of LogLine.formats) {
      const line = LogLine.format(entry, layout)
      // eslint-disable-next-line no-control-regex
      expect(line, layout).not.toMatch(/[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/)
    }
    const json = LogLine.parse(LogLine.format(entry, "json"))
    expect(json).toMatchObject({ message: entry.message, fields: { name: hostile, plain: "scanner-1" } })
    const pretty = LogLine.format(entry, "pretty")
    expect(pretty).toContain("plain=scanner-1")
    expect(JSON.parse(/name=("(?:[^"\\]|\\.)*")/.exec(pretty)![1])).toBe(hostile)
  })
})
