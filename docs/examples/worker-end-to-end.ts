// file: docs/examples/worker-end-to-end.ts
import { Store } from "@scanfleet/core"
import { Database, Server, ServerConfig } from "@scanfleet/server-example"
import { Scanner, Supervisor } from "@scanfleet/worker"
import { Effect, Layer, ManagedRuntime } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

// A server on a free port, over an in-process store, with two targets queued.
const config = ServerConfig.make({ databaseUrl: "memory:", adminToken: "an-admin-token-of-at-least-16-characters", port: 0, logLevel: "warning" })
const server = ManagedRuntime.make(Server.layer(config).pipe(Layer.provide(Database.layer(config.databaseUrl))))
const { url } = await server.runPromise(Server.Info)
const store = (f: (s: Store.StoreShape) => Effect.Effect<unknown, unknown>) => server.runPromise(Effect.flatMap(Store.Store, f))
await store((s) => s.recordObservations([{ source: "github", identity: "octo/app", remoteAt: Date.now() - 60_000 }, { source: "github", identity: "octo/infra-leaky", remoteAt: Date.now() - 60_000 }], Date.now()))

// Register a device (the admin API shows its token once), then run it with the runner module.
const admin = { authorization: `Bearer ${config.adminToken}` }
const res = await fetch(`${url}/v1/admin/devices`, { method: "POST", headers: admin, body: JSON.stringify({ name: "my-device", slots: 2 }) })
const { token } = (await res.json()) as { token: string }
const device = await Supervisor.start({
  server: url,
  token,
  slots: 2,
  pollMs: 100,
  state: join(mkdtempSync(join(tmpdir(), "scanfleet-worker-")), "worker.db"),
  scanner: Scanner.runnerModule({ name: "my-scanner", module: new URL("./my-runner.mjs", import.meta.url) })
})

// Wait until both targets are scanned, then stop the device and the server.
type Listed = { assignments: Array<{ target: { identity: string }; outcome: string | null }> }
const outcomes = async () => ((await (await fetch(`${url}/v1/admin/assignments?limit=10`, { headers: admin })).json()) as Listed).assignments
for (let i = 0; i < 600 && (await outcomes()).filter((a) => a.outcome !== null).length < 2; i++) await new Promise((resolve) => setTimeout(resolve, 100))
for (const a of await outcomes()) console.log(`${a.target.identity}: ${a.outcome}`)
await device.stop()
await server.dispose()
