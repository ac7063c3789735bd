import { execFile } from "node:child_process"
import { createReadStream, existsSync, mkdirSync, rmSync, statSync, writeFileSync } from "node:fs"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { dirname, join, normalize, relative, resolve, sep } from "node:path"
import { promisify } from "node:util"

const run = promisify(execFile)

/**
 * Real git repositories for the demo's targets, made from fixture files at
 * start and served read-only over HTTP on loopback with git's dumb protocol
 * (static files after `git update-server-info`), so a worker's acquire step
 * clones them with plain `git clone`. Commits pushed while the demo runs change
 * what the next scan finds.
 */
export interface GitRepos {
  /** Base URL; a target's repository is `<url>/<source>/<identity>/.git`. */
  readonly url: string
  /** Creates a target's repository with these files and one commit, unless it exists. */
  readonly ensure: (source: string, identity: string, files: Readonly<Record<string, string>>) => Promise<void>
  /**
   * Commits a change (files written, files removed) to an existing repository. A change already
   * made (by an earlier run over the same data folder) is committed empty: still a new revision.
   */
  readonly commit: (source: string, identity: string, change: { readonly write?: Readonly<Record<string, string>>; readonly remove?: ReadonlyArray<string>; readonly message: string }) => Promise<void>
  readonly close: () => Promise<void>
}

const env = { ...process.env, GIT_AUTHOR_NAME: "scanfleet demo", GIT_AUTHOR_EMAIL: "demo@example.invalid", GIT_COMMITTER_NAME: "scanfleet demo", GIT_COMMITTER_EMAIL: "demo@example.invalid", GIT_CONFIG_NOSYSTEM: "1", HOME: "/nonexistent" }
const git = (cwd: string, ...args: Array<string>) => run("git", ["-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", ...args], { cwd, env })

/** Starts the git server over a folder (created if missing); `fallback` gives the files of a repository first asked for without fixtures. */
export const start = async (root: string, fallback: (source: string, identity: string) => Readonly<Record<string, string>>): Promise<GitRepos> => {
  const base = resolve(root)
  mkdirSync(base, { recursive: true })
  const server = createServer((req, res) => {
    const path = decodeURIComponent((req.url ?? "/").split("?")[0])
    const file = normalize(join(base, path))
    // A target without fixture files of its own gets the fallback's, made on its first fetch.
    const m = /^\/([a-z]+)\/(.+?)\/\.git\//.exec(path)
    const made = m && !relative(base, file).startsWith("..") ? repos.ensure(m[1], m[2], fallback(m[1], m[2])) : Promise.resolve()
    made.then(
      () => {
        // Only files inside the folder, and only what a dumb-protocol clone reads (under a .git directory).
        if (req.method !== "GET" || relative(base, file).startsWith("..") || !file.split(sep).includes(".git") || !existsSync(file) || !statSync(file).isFile()) {
          res.writeHead(404).end()
          return
        }
        res.writeHead(200, { "content-type": "application/octet-stream" })
        createReadStream(file).pipe(res)
      },
      () => res.writeHead(500).end()
    )
  })
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const dirOf = (source: string, identity: string) => join(base, source, ...identity.split("/"))
  const write = (dir: string, files: Readonly<Record<string, string>>) => {
    for (const [name, text] of Object.entries(files)) {
      const f = join(dir, name)
      mkdirSync(dirname(f), { recursive: true })
      writeFileSync(f, text)
    }
  }
  // One commit at a time per process: git's index lock does not like company.
  let queue: Promise<unknown> = Promise.resolve()
  const serial = <A>(f: () => Promise<A>): Promise<A> => {
    const next = queue.then(f, f)
    queue = next.catch(() => undefined)
    return next
  }
  const repos: GitRepos = {
    url,
    ensure: (source, identity, files) =>
      serial(async () => {
        const dir = dirOf(source, identity)
        if (existsSync(join(dir, ".git"))) return
        mkdirSync(dir, { recursive: true })
        await git(dir, "init", "-q")
        write(dir, files)
        await git(dir, "add", "-A")
        await git(dir, "commit", "-q", "-m", `initial import of ${identity}`)
        await git(dir, "update-server-info")
      }),
    commit: (source, identity, change) =>
      serial(async () => {
        const dir = dirOf(source, identity)
        write(dir, change.write ?? {})
        for (const f of change.remove ?? []) rmSync(join(dir, f), { force: true })
        await git(dir, "add", "-A")
        await git(dir, "commit", "-q", "--allow-empty", "-m", change.message)
        await git(dir, "update-server-info")
      }),
    close: () => new Promise<void>((r) => server.close(() => r()))
  }
  return repos
}
