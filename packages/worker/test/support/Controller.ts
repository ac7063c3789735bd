import { execa, type ResultPromise } from "execa"
import { chmodSync, readdirSync, renameSync, rmSync } from "node:fs"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { build } from "tsup"
import { standalone } from "../../../../build/standalone.js"

/**
 * The worker CLI as a separate process, so a test can `kill -9` its
 * controller. The CLI is bundled from source once per test file, as the
 * package's build makes its bin (build/standalone.ts), next to the package,
 * where it finds the packaged execution-unit script as the built package does.
 */

const outDir = fileURLToPath(new URL("../../.test-build/", import.meta.url))
let built: Promise<string> | null = null

/** Builds the CLI bundle (once per process); resolves to its path. */
export const bundle = (): Promise<string> =>
  (built ??= bundleEntry(fileURLToPath(new URL("../fixtures/cli-entry.ts", import.meta.url)), "cli", outDir, { standalone: true }).then(() => `${outDir}cli.js`))

/**
 * Bundles one TypeScript entry to `<outDir>/<name>.js`. `outDir` must sit one
 * level under packages/worker, where the bundle finds `runtime/` as the built
 * package does. Test files run in parallel processes that each bundle the
 * same entries while others run them: the bundle is written to a folder of
 * this process's own and renamed into place, so no process ever reads a
 * half-written file. Workspace packages are inlined and other dependencies
 * left to node_modules, as an embedder's build would, except in a `standalone`
 * bundle, which the package's build makes of its CLI, execution unit and demo
 * scanner (build/standalone.ts).
 */
export const bundleEntry = async (entry: string, name: string, dir: string, opts: { readonly standalone?: boolean } = {}): Promise<void> => {
  const scratch = join(dir, `.tmp-${process.pid}-${name}`)
  await build({
    ...standalone(name, { [name]: entry }, scratch),
    config: false,
    silent: true,
    ...(opts.standalone ? {} : { noExternal: [/^@scanfleet\//], external: [/^(?!@scanfleet\/)[^./]/] })
  })
  // Executable before it is in place: some bundles run as commands of their own.
  for (const file of readdirSync(scratch)) {
    chmodSync(join(scratch, file), 0o755)
    renameSync(join(scratch, file), join(dir, file))
  }
  rmSync(scratch, { recursive: true, force: true })
}

/** The bundle's path (call `bundle()` first, for example in `beforeAll`). */
export const cliPath = `${outDir}cli.js`

/**
 * Starts `scanfleet-worker` with arguments (and environment variables beside
 * the test's). Not async on purpose: awaiting a subprocess waits for its
 * exit, and callers need it running.
 */
export const spawnCli = (args: ReadonlyArray<string>, env: Record<string, string> = {}): ResultPromise<{ reject: false; all: true }> =>
  execa(process.execPath, [cliPath, ...args], { reject: false, all: true, env: { ...process.env, ...env } })

/** A running `scanfleet-worker run`: its process, and what it wrote to stdout and stderr so far. */
export interface RunningDevice {
  readonly p: ResultPromise<{ reject: false; all: true }>
  readonly out: () => string
}

/**
 * Starts `scanfleet-worker run` against a server on a state file, polling
 * every 50 ms with a 300 ms grace; `defer` (see `useCleanups`) gets the kill
 * that ends it if the test did not.
 */
export const runDevice = (
  server: { readonly url: string; readonly token: string },
  state: string,
  scanner: string,
  defer: (cleanup: () => Promise<unknown>) => void,
  opts: { readonly slots?: number } = {}
): RunningDevice => {
  const p = spawnCli(["run", "--server", server.url, "--token", server.token, "--slots", String(opts.slots ?? 1), "--scanner", scanner, "--state", state, "--poll-ms", "50", "--grace-ms", "300"])
  let out = ""
  p.all?.on("data", (d: Buffer) => (out += d.toString("utf8")))
  defer(async () => {
    if (p.exitCode === null && p.pid) p.kill("SIGKILL")
    await p
  })
  return { p, out: () => out }
}
