// file: docs/examples/server-embed.ts
import { Store } from "@scanfleet/core"
import { Database, Server, ServerConfig } from "@scanfleet/server-example"
import { Effect, Layer, ManagedRuntime } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

// The same composition `scanfleet-server serve` runs: settings, a store from a database URL, the server over it.
const config = ServerConfig.make({
  databaseUrl: `sqlite:${join(mkdtempSync(join(tmpdir(), "scanfleet-")), "fleet.db")}`,
  adminToken: "an-admin-token-of-at-least-16-characters",
  port: 0, // any free port
  logLevel: "warning"
})
const server = ManagedRuntime.make(Server.layer(config).pipe(Layer.provide(Database.layer(config.databaseUrl))))
const { url } = await server.runPromise(Server.Info)

// Discovery would normally admit targets; here one is recorded through the same store.
const now = Date.now()
await server.runPromise(Effect.flatMap(Store.Store, (s) => s.recordObservations([{ source: "dockerhub", identity: "library/nginx@sha256:0f3a", remoteAt: null }], now)))

// An operator registers a device; the token is shown once.
const admin = { authorization: `Bearer ${config.adminToken}` }
const created = await (await fetch(`${url}/v1/admin/devices`, { method: "POST", headers: admin, body: JSON.stringify({ name: "scanner-1", slots: 2 }) })).json()

// The device claims an assignment: three labelled deadlines and the policy that set them.
const device = { authorization: `Bearer ${created.token}` }
const { assignment } = await (await fetch(`${url}/v1/assignments/claim`, { method: "POST", headers: device, body: JSON.stringify({ slot: 0 }) })).json()
for (const d of Object.values(assignment.deadlines) as Array<{ label: string; iso: string }>) console.log(`${d.label}: ${d.iso}`)
console.log(`fires next: ${assignment.nextDeadline.label}; policy: ${assignment.policy.origin} TTL ${assignment.policy.ttlSeconds} s`)

// Releasing the runtime shuts the server down gracefully and closes the database.
await server.dispose()
