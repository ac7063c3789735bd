import { NodeHttpClient } from "@effect/platform-node"
import { DiscoveryCycle, GitHub, SqliteStore } from "@scanfleet/adapters"
import * as FakeSources from "@scanfleet/adapters/testing/FakeSources"
import { Config, Store } from "@scanfleet/core"
import { Effect } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

// A local stand-in for the GitHub API (drop `baseUrl` below and add a token to list the real one).
const program = Effect.gen(function* () {
  const fakes = yield* FakeSources.scoped()
  fakes.github.put("acme/api", Date.UTC(2025, 4, 1))
  fakes.github.put("acme/web", Date.UTC(2025, 4, 2))

  const store = yield* Store.Store
  const github = yield* GitHub.make({ baseUrl: fakes.github.url, token: process.env.GITHUB_TOKEN, listings: [{ kind: "org", org: "acme" }] })
  const settings = { limits: { maxPages: 10, maxResults: 1000 }, config: Config.defaults }

  const first = yield* DiscoveryCycle.run(github, store, settings, Date.now())
  console.log(`first cycle: ${first.queuedNewCount} new, ${first.queuedUpdatedCount} updated`) // 2 new, 0 updated

  const again = yield* DiscoveryCycle.run(github, store, settings, Date.now())
  console.log(`second cycle: ${again.queuedNewCount} new, ${again.queuedUpdatedCount} updated`) // 0 new, 0 updated
  console.log(yield* store.countTargets()) // [ { source: 'github', status: 'pending', count: 2 } ]
})

// SQLite in a file (PgStore.layer({ url: Redacted.make(process.env.DATABASE_URL!) }) is the PostgreSQL one).
const filename = join(mkdtempSync(join(tmpdir(), "scanfleet-")), "fleet.db")
await Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(SqliteStore.layer({ filename })), Effect.provide(NodeHttpClient.layer)))
