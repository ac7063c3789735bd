import { availableParallelism } from "node:os"
import { relative } from "node:path"
import { fileURLToPath } from "node:url"
import { defineConfig } from "vitest/config"
import { BaseSequencer, type TestSpecification } from "vitest/node"

const root = fileURLToPath(new URL(".", import.meta.url))
const src = (name: string) => fileURLToPath(new URL(`./packages/${name}/src/index.ts`, import.meta.url))

/**
 * The files that take longest, slowest first (measured on a 2-core machine),
 * in whichever project they are.
 * Most of their time is waiting (deadlines, grace periods, servers and
 * scanners in child processes), so they are started first and the shorter
 * files fill the gaps; left to vitest's own order on a fresh clone (largest
 * file first) the small per-level Containment files would start last and
 * finish the run on their own. A prefix matches every file it starts.
 */
const longFirst = [
  "test/packaging.test.ts",
  "packages/worker/test/Containment.",
  "test/demo/demo.test.ts",
  "packages/server-example/test/OperatingDocs.test.ts",
  "test/reliability/server-crash.test.ts",
  "packages/worker/test/ExecutionUnit.test.ts",
  "packages/server-example/test/Cli.test.ts",
  "test/demo/variants.test.ts",
  "test/docs-blocks.test.ts",
  "test/reliability/worker-crash.test.ts",
  "test/reliability/load.test.ts",
  "test/reliability/network.test.ts"
]

/** vitest's order (failed first, then by the last run's duration), except that the files of `longFirst` start first. */
class LongFirst extends BaseSequencer {
  override async sort(files: Array<TestSpecification>): Promise<Array<TestSpecification>> {
    const rank = (f: TestSpecification) => {
      const rel = relative(root, f.moduleId)
      const i = longFirst.findIndex((p) => rel.startsWith(p))
      return i < 0 ? longFirst.length : i
    }
    const sorted = await super.sort(files)
    return sorted
      .map((f, i) => ({ f, i, r: rank(f) }))
      .sort((a, b) => a.r - b.r || a.i - b.i)
      .map(({ f }) => f)
  }
}

/**
 * Test processes at once. vitest's default is one fewer than the cores (a
 * single process on a 2-core machine), which suits CPU-bound files; most of
 * these wait on timers and child processes, so twice the cores (at least 4)
 * keep the cores busy without making the waits longer.
 * `vitest run --maxWorkers=N` still overrides it.
 */
const forks = Math.max(4, 2 * availableParallelism())

/**
 * Files whose tests assert how soon something happens after a deadline
 * (every process dead within grace + 1 s, a lease handed over within one
 * period plus a poll, health answers within 1 s under load). They run in
 * projects of their own, one group at a time, so that the CPU-heavy files (the
 * packaging type-checks and installs, the 200 MB floods, the doc blocks, the
 * load test) never take the two cores from them: a plain `vitest run` runs the
 * groups first and the rest after them; `npm test` (test/run.mjs) runs the
 * groups in one `vitest run` and the rest in another beside it at nice 19, so
 * the rest uses the CPU the groups leave while they wait. The per-level Containment files run
 * the same scanners in the same order, so run together they would fork-storm
 * at the same moment during the grace they measure: two levels per group at
 * most, and freeze-kill alone.
 * The three-server lease test and the SQLite load test (a p99 with 200
 * devices on the two cores) each run alone.
 */
const timing = [
  ["packages/worker/test/Containment.pid-namespace.test.ts", "packages/worker/test/Containment.cgroup-v2.test.ts"],
  // a device, its units and a server: apart from the containment levels, since beside two of them a
  // fresh-clone run saw a device's unit freed 2.8 s after its deadline against grace + 1 s, and a
  // pid-namespace unit's copies dead 3.9 s after it against grace + 1 s
  ["packages/worker/test/Cancel.test.ts", "packages/worker/test/Device.test.ts", "packages/worker/test/ExecutionUnit.test.ts"],
  // a device whose wall clock steps while a scanner ignores SIGTERM, killed by deadline + grace + 1 s
  ["packages/worker/test/WallClockStep.test.ts"],
  // a slot freed within grace + 1.5 s of its deadline while a big work folder is still being
  // removed: among the rest, at nice 19 beside the groups' scanners, a fresh-clone run saw its
  // process held off the CPU for 18 s and the slot freed 2.1 s after the deadline
  ["packages/worker/test/ScanStageEnd.test.ts"],
  // a server and workers in child processes (which inherit the rest's nice 19) asserting a timeout
  // recorded within 2.5 s of the real deadline and an expiry swept within 2 s of it
  ["test/reliability/clock.test.ts"],
  [
    "packages/worker/test/Containment.cgroup-v1-freezer.test.ts",
    // the demo's one slow target must be the only one that reaches its deadline
    "test/demo/demo.test.ts"
  ],
  // freeze-kill, the level without a kernel boundary, finds a unit's processes by scanning them:
  // alone, since beside the demo's fleet (a server, workers and discovery) and another level's
  // scanners fresh-clone runs saw copies die 400 ms past grace + 1 s, a grandchild killed before it
  // recorded its pid, and a double-forked daemon still alive when the unit had settled
  ["packages/worker/test/Containment.freeze-kill.test.ts"],
  // three servers and PostgreSQL handing a lease over within a period: alone, and not beside the
  // containment files, whose grace + 1 s they would use up
  ["packages/server-example/test/ThreeServers.postgres.test.ts"],
  // 200 devices and a probe against one server, measuring the server's p99: alone
  ["packages/server-example/test/SqliteUnderLoad.test.ts"],
  // every request answered within its busy budget while another process holds the write lock, and a
  // prompt shutdown after: apart from the CPU-bound rest
  ["packages/server-example/test/SqliteLockRecovery.test.ts"]
]

const alias = {
  "@scanfleet/core": src("core"),
  // listed before the package itself: the first alias whose prefix matches wins
  "@scanfleet/adapters/Conformance": fileURLToPath(new URL("./packages/adapters/src/Conformance.ts", import.meta.url)),
  "@scanfleet/adapters/testing/FakeSources": fileURLToPath(new URL("./packages/adapters/src/testing/FakeSources.ts", import.meta.url)),
  "@scanfleet/adapters/testing": fileURLToPath(new URL("./packages/adapters/src/testing.ts", import.meta.url)),
  "@scanfleet/adapters": src("adapters"),
  "@scanfleet/worker": src("worker"),
  "@scanfleet/server-example": src("server-example")
}

/** What both projects share. Not `extends: true`: that would run the global setup (and start PostgreSQL) once more per project. */
const shared = {
  pool: "forks",
  testTimeout: 60_000,
  hookTimeout: 120_000,
  // reports a test worker's event loop held for over 10 s, naming the file and test
  setupFiles: ["./test/stallWatch.ts"]
}

export default defineConfig({
  resolve: { alias },
  test: {
    // Runs once for the whole run; both projects get its pgUrl.
    globalSetup: ["./test/globalSetup.ts"],
    ...shared,
    maxWorkers: forks,
    minWorkers: 1,
    sequence: { sequencer: LongFirst },
    reporters: ["default"],
    projects: [
      ...timing.map((include, i) => ({ resolve: { alias }, test: { ...shared, name: `timing-${i + 1}`, include, sequence: { groupOrder: i } } })),
      {
        resolve: { alias },
        test: {
          ...shared,
          name: "rest",
          include: ["packages/*/test/**/*.test.ts", "test/**/*.test.ts"],
          exclude: ["**/node_modules/**", ...timing.flat()],
          sequence: { groupOrder: timing.length }
        }
      }
    ]
  }
})
