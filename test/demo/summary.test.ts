import { describe, expect, it } from "vitest"
import * as Summary from "../../packages/server-example/src/demo/Summary.js"

const numbers = (completed: number): Summary.Numbers => ({
  targets: { queuedNew: 5, queuedUpdated: 1, pending: 2, inProgress: 1, completed, failed: 0 },
  assignments: { running: 1, completed, timedOut: 1, failed: 1, expired: 0, released: 0 },
  serverNow: 0
})

const sink = (isTTY: boolean) => {
  const writes: Array<string> = []
  return { isTTY, writes, write: (s: string) => writes.push(s) }
}

describe("the demo's live summary", () => {
  it("on a terminal, redraws one block in place: cursor up over the previous block, each line cleared", () => {
    const out = sink(true)
    const p = Summary.printer(out)
    p.show(numbers(3), 0)
    p.show(numbers(4), 1000)
    expect(out.writes[0]).not.toContain("\x1b[4A")
    expect(out.writes[1].startsWith("\x1b[4A")).toBe(true)
    expect(out.writes[1]).toContain("completed 4")
    expect(out.writes[1]).toContain("last error none")
    expect(out.writes[1].split("\x1b[K\n")).toHaveLength(5)
  })

  it("on a pipe, prints a plain line only when a number changed", () => {
    const out = sink(false)
    const p = Summary.printer(out)
    p.show(numbers(3), 0)
    p.show(numbers(3), 1000)
    p.show(numbers(4), 2000)
    expect(out.writes).toHaveLength(2)
    expect(out.writes.join("")).not.toContain("\x1b[")
    expect(out.writes[1]).toContain("queued_new=5 queued_updated=1")
    expect(out.writes[1]).toContain("completed=4 timed_out=1")
  })

  it("shows the source errors and the newest error, whether a failed cycle or an error log line", () => {
    const sources: Summary.SourceErrors = { bySource: { github: 0, gitlab: 2, huggingface: 0, dockerhub: 1 }, last: { at: Date.UTC(2025, 0, 1, 10, 0, 5), text: "gitlab: HTTP 503 after 2 attempts" } }
    const text = Summary.lines(numbers(3), 0, { sources }).join("\n")
    expect(text).toContain("source errors github 0   gitlab 2   huggingface 0   dockerhub 1")
    expect(text).toContain("last error 10:00:05 gitlab: HTTP 503 after 2 attempts")
    // A newer error line from the log wins over the older failed cycle.
    const newer = Summary.lines(numbers(3), 0, { sources, lastErrorLine: { at: Date.UTC(2025, 0, 1, 10, 0, 9), text: "worker_error error=connect ECONNREFUSED" } }).join("\n")
    expect(newer).toContain("last error 10:00:09 worker_error error=connect ECONNREFUSED")
    const out = sink(false)
    Summary.printer(out).show(numbers(3), 0, { sources })
    expect(out.writes[0]).toContain("source_errors=3")
    expect(out.writes[0]).toContain('last_error="gitlab: HTTP 503 after 2 attempts"')
  })
})
