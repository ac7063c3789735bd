import { SqliteStore } from "@scanfleet/adapters"
import { Config, Store } from "@scanfleet/core"
import { Effect } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

const program = Effect.gen(function* () {
  const store = yield* Store.Store
  const now = Date.now()
  // discovery: new identities become pending targets
  const seen = yield* store.recordObservations([{ source: "github", identity: "acme/api", remoteAt: now - 60_000 }], now)
  console.log(seen) // { inserted: [ 'acme/api' ], known: 0 }

  // a device with two slots claims the target: a fenced assignment with three deadlines
  const device = yield* store.addDevice({ name: "scanner-1", slots: 2, tokenHash: "sha256-of-the-token", now })
  const a = yield* store.claim({ deviceId: device.id, slot: 0, now, config: Config.defaults })
  if (a === null) return
  console.log(a.identity, a.fence, new Date(a.scanDeadline).toISOString(), new Date(a.expiresAt).toISOString())

  // every worker write carries the reservation and its fence
  const auth = { deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now }
  yield* store.appendProgress(auth, [{ seq: 1, kind: "phase", phase: "assigned", at: now }])
  console.log(yield* store.submitResult({ ...auth, outcome: "clean", finalPhase: "assigned", body: "{}" }))
  console.log(yield* store.countTargets()) // [ { source: 'github', status: 'completed', count: 1 } ]
})

// One database file; the schema is created or brought up to date when the layer starts.
const filename = join(mkdtempSync(join(tmpdir(), "scanfleet-")), "fleet.db")
await Effect.runPromise(program.pipe(Effect.provide(SqliteStore.layer({ filename }))))
