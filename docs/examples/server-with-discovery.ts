// file: docs/examples/server-with-discovery.ts
import { NodeHttpClient } from "@effect/platform-node"
import { GitLab } from "@scanfleet/adapters"
import * as FakeSources from "@scanfleet/adapters/testing/FakeSources"
import { Database, Scheduler, Server, ServerConfig } from "@scanfleet/server-example"
import { Effect, Layer, ManagedRuntime } from "effect"

// Local stand-ins for the public APIs; point `baseUrl` at https://gitlab.com (and pass a token) for the real one.
const fakes = await FakeSources.start()
FakeSources.seed(fakes, Date.now(), 6)

const config = ServerConfig.make({ databaseUrl: "memory:", adminToken: "an-admin-token-of-at-least-16-characters", port: 0, logLevel: "warning" })

// One schedule per source: a client, a cadence with jitter, and hard page and result limits.
const gitlab = Effect.map(GitLab.make({ baseUrl: fakes.gitlab.url, pageSize: 3, retries: 1, backoffMs: 200, timeoutMs: 5000 }), (client) => [
  { client, intervalMs: 60_000, jitterMs: 100, limits: { maxPages: 5, maxResults: 100 } }
])
const discovery = Layer.unwrapEffect(Effect.map(gitlab, Scheduler.layer)).pipe(Layer.provide(NodeHttpClient.layerUndici))

// The scheduler writes through the server's store, so its admissions show in /metrics and on the dashboard.
const fleet = ManagedRuntime.make(discovery.pipe(Layer.provideMerge(Server.layer(config)), Layer.provide(Database.layer(config.databaseUrl))))
const { url } = await fleet.runPromise(Server.Info)

const admin = { authorization: `Bearer ${config.adminToken}` }
let cycles: Array<{ source: string; queuedNewCount: number; queuedUpdatedCount: number; stopReason: string }> = []
for (let i = 0; i < 100 && cycles.length === 0; i++) {
  await new Promise((r) => setTimeout(r, 100))
  cycles = (await (await fetch(`${url}/v1/admin/cycles`, { headers: admin })).json()).cycles
}
for (const c of cycles) console.log(`${c.source}: ${c.queuedNewCount} new, ${c.queuedUpdatedCount} updated (${c.stopReason})`)
console.log((await (await fetch(`${url}/metrics`)).text()).split("\n").filter((l) => l.startsWith("scanfleet_new_admissions_total")).join("\n"))

await fleet.dispose()
await fakes.close()
