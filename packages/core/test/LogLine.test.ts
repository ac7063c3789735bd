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
