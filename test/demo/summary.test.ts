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
    expect(out.writes[0]).not.toContain("\x1b[3A")
    expect(out.writes[1].startsWith("\x1b[3A")).toBe(true)
    expect(out.writes[1]).toContain("completed 4")
    expect(out.writes[1].split("\x1b[K\n")).toHaveLength(4)
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
})
