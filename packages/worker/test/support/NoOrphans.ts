import { randomUUID } from "node:crypto"
import { readdirSync, readFileSync } from "node:fs"
import { afterEach, beforeEach } from "vitest"

/**
 * Fails any test that leaves a process behind. Every process a test starts
 * inherits a marker in its environment (children, grandchildren, and those a
 * dead parent left to init alike), so /proc finds them wherever they went.
 * Zombies are dead and do not count.
 */
const VAR = "SCANFLEET_TEST_PROCESS_MARK"

/** Live processes carrying `mark` in their environment. */
export const marked = (mark: string): Array<{ pid: number; cmd: string }> => {
  const out: Array<{ pid: number; cmd: string }> = []
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "utf8")
      const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0]
      if (state === "Z" || state === "X") continue
      if (!readFileSync(`/proc/${name}/environ`, "utf8").split("\0").includes(`${VAR}=${mark}`)) continue
      out.push({ pid: Number(name), cmd: readFileSync(`/proc/${name}/cmdline`, "utf8").split("\0").join(" ").trim().slice(0, 200) })
    } catch {
      // gone meanwhile, or not ours to read
    }
  }
  return out
}

/** The current test's marker (set by `useNoOrphans`). */
export const currentMark = (): string => process.env[VAR] ?? ""

/**
 * Installs the check around every test of the file: a survivor after the
 * test (given `settleMs` to die) fails it, and is killed so it cannot spoil
 * the next test.
 */
export const useNoOrphans = (settleMs = 1500) => {
  beforeEach(() => {
    process.env[VAR] = randomUUID()
  })
  afterEach(async () => {
    const mark = currentMark()
    const until = Date.now() + settleMs
    let left = marked(mark)
    while (left.length > 0 && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 25))
      left = marked(mark)
    }
    for (const p of left) {
      try {
        process.kill(p.pid, "SIGKILL")
      } catch {
        // already gone
      }
    }
    if (left.length > 0) throw new Error(`the test left ${left.length} process(es) behind:\n${left.map((p) => `  ${p.pid} ${p.cmd}`).join("\n")}`)
  })
}
