// `npm test`: vitest's timing projects and the rest side by side, the rest at nice 19.
//
// The timing projects (vitest.config.ts) assert how soon something happens after a deadline, so
// they run one group at a time, and they spend most of their five minutes waiting: measured alone
// they kept 27 % of two cores busy. The rest is CPU-bound from start to end. One `vitest run`
// orders them one after the other, and the cores idle through the timing groups; side by side at
// one priority, the rest would take the CPU the deadlines are measured against. So the rest's
// whole process tree (its vitest, test processes, servers, scanners, npm and tsc, and its own
// PostgreSQL) runs at nice 19 and gets what the timing groups leave. Not SCHED_IDLE: there a
// rest file's event loop once went 15 s without a turn while the timing groups were busy, a
// quarter of the 60 s after which vitest fails the run.
//
// With arguments (`npm test -- packages/core`, `npm test -- --project rest`) it is one plain
// `vitest run` with them, at the usual priority.
import { spawn, spawnSync } from "node:child_process"
import { existsSync } from "node:fs"
import { createRequire } from "node:module"
import { setPriority } from "node:os"
import { dirname, join } from "node:path"
import { createInterface } from "node:readline"
import { fileURLToPath } from "node:url"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")
const vitest = join(dirname(createRequire(import.meta.url).resolve("vitest/package.json")), "vitest.mjs")
const args = process.argv.slice(2)

// Debian packages some tests drive: Chromium (the dashboard and console) and libfaketime (a
// device's wall clock stepped). Installed here when missing and this runs as root with apt-get, so
// `npm ci && npm test` needs nothing installed by hand; otherwise those tests say what to install.
const debian = [
  ["chromium", "/usr/bin/chromium"],
  ["faketime", "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"]
]
const missing = debian.filter(([, path]) => !existsSync(path)).map(([name]) => name)
if (missing.length > 0 && process.getuid?.() === 0 && existsSync("/usr/bin/apt-get")) {
  console.log(`npm test: installing the Debian packages some tests drive: ${missing.join(", ")}`)
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" }
  spawnSync("apt-get", ["update"], { stdio: "inherit", env })
  spawnSync("apt-get", ["install", "-y", ...missing], { stdio: "inherit", env })
}

const children = new Set()
// Ctrl-C reaches the children from the terminal; a SIGTERM sent to this process alone is passed on.
process.on("SIGINT", () => {})
process.on("SIGTERM", () => children.forEach((c) => c.kill("SIGTERM")))

if (args.length > 0) {
  const child = spawn(process.execPath, [vitest, "run", ...args], { cwd: root, stdio: "inherit" })
  children.add(child)
  child.on("close", (code) => process.exit(code ?? 1))
} else {
  /** One `vitest run` of the given projects, its output passed on line by line so the two never cut into each other's lines. */
  const run = (name, projects, niced) => {
    const started = Date.now()
    const argv = [vitest, "run", ...projects.flatMap((p) => ["--project", p])]
    // Piped, vitest would drop its colours; a terminal still gets them.
    const options = { cwd: root, env: process.stdout.isTTY ? { FORCE_COLOR: "1", ...process.env } : process.env }
    const child = spawn(process.execPath, argv, options)
    // Before vitest has started anything: its children inherit the priority.
    if (niced) setPriority(child.pid, 19)
    children.add(child)
    for (const [from, to] of [
      [child.stdout, process.stdout],
      [child.stderr, process.stderr]
    ])
      createInterface({ input: from, crlfDelay: Infinity }).on("line", (line) => to.write(line + "\n"))
    return new Promise((resolve) =>
      child.on("close", (code, signal) => resolve({ name, ok: code === 0, how: signal ?? `exit ${code}`, seconds: (Date.now() - started) / 1000 }))
    )
  }

  console.log(
    `npm test: the timing projects and the rest side by side, the rest at nice 19; each prints its own summary, and this ends with both`
  )
  const runs = [run("timing projects", ["timing-*"], false), run("the rest", ["rest"], true)]
  const results = await Promise.all(runs)
  for (const r of results) console.log(`npm test: ${r.name} ${r.ok ? "passed" : `FAILED (${r.how})`} in ${r.seconds.toFixed(0)} s`)
  process.exit(results.every((r) => r.ok) ? 0 : 1)
}
