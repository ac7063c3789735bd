import { mkdtempSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { bundle, spawnCli } from "./support/Controller.js"
import { useNoOrphans } from "./support/NoOrphans.js"

/**
 * `scanfleet-worker run` stops on SIGTERM whatever the server does: here there is none, so the
 * device never learns its fleet key and keeps retrying for it, and a SIGTERM still ends it.
 */
useNoOrphans()

const dir = mkdtempSync(join(tmpdir(), "scanfleet-stop-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))
beforeAll(() => bundle(), 120_000)

// A loopback port with nothing listening on it.
const closedPort = () =>
  new Promise<number>((resolve) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port
      s.close(() => resolve(port))
    })
  })

describe("stopping a device", () => {
  it("SIGTERM ends a worker that cannot reach its server (it was waiting for the fleet key) within seconds, exit 0", async () => {
    const port = await closedPort()
    const p = spawnCli(["run", "--server", `http://127.0.0.1:${port}`, "--token", "sfd_unreachable", "--slots", "1", "--scanner", "demo", "--state", join(dir, "w.db"), "--poll-ms", "50"])
    // long enough to have started, asked for the key and begun to retry
    await new Promise((r) => setTimeout(r, 3000))
    const runningWhenStopped = p.exitCode === null
    const sent = Date.now()
    p.kill("SIGTERM")
    const exit = await Promise.race([p, new Promise<null>((r) => setTimeout(() => r(null), 20_000))])
    if (exit === null) {
      p.kill("SIGKILL")
      await p
    }
    expect(runningWhenStopped, "the worker exited before it was stopped").toBe(true)
    expect(exit, "still running 20 s after SIGTERM").not.toBeNull()
    expect(Date.now() - sent).toBeLessThan(20_000)
    expect(exit!.exitCode, exit!.all).toBe(0)
  }, 60_000)

  it("a --server that is not an http(s) URL is refused at start with exit 2, naming the flag", async () => {
    for (const server of ["notaurl", "ftp://127.0.0.1/"]) {
      const exit = await spawnCli(["run", "--server", server, "--token", "sfd_x", "--scanner", "demo", "--state", join(dir, "u.db")])
      expect(exit.exitCode, exit.all).toBe(2)
      expect(exit.all).toContain("--server")
    }
  }, 60_000)

  it("a negative number after a flag reaches the flag's own check, as --flag=-5 does, instead of reading as an unknown option", async () => {
    for (const args of [
      ["--grace-ms", "-5"],
      ["--grace-ms=-5"]
    ]) {
      const exit = await spawnCli(["run", "--server", "http://127.0.0.1:1", "--token", "sfd_x", "--scanner", "demo", "--state", join(dir, "n.db"), ...args])
      expect(exit.exitCode, exit.all).toBe(2)
      expect(exit.all).toContain("--grace-ms must be a non-negative integer, not -5")
      expect(exit.all).not.toContain("unknown option")
    }
  }, 60_000)
})
