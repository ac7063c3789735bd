// file: docs/examples/effect-queue.ts
import { Database } from "@scanfleet/adapters"
import { Config, Store } from "@scanfleet/core"
import { Clock, Effect } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

// The same queue from Effect: the Store port, provided by the layer a database URL names.
const program = Effect.gen(function* () {
  const store = yield* Store.Store
  const now = yield* Clock.currentTimeMillis
  yield* store.recordObservations([{ source: "gitlab", identity: "group/service", remoteAt: now - 60_000 }], now)
  const device = yield* store.addDevice({ name: "my-scanner", slots: 1, tokenHash: "sha256-of-the-device-token", now })
  const a = yield* store.claim({ deviceId: device.id, slot: 0, now, config: Config.defaults })
  if (a === null) return yield* Effect.dieMessage("a target was pending")
  const auth = { deviceId: device.id, reservationId: a.reservationId, fence: a.fence, now }
  yield* store.appendProgress(auth, [{ seq: 1, kind: "phase", phase: "assigned", at: now }])
  const receipt = yield* store.submitResult({ ...auth, outcome: "clean", finalPhase: "assigned", body: JSON.stringify({ findings: [] }) })
  console.log(`${a.identity}: ${receipt.outcome} (receipt ${receipt.receiptId})`)
  // Refusals are typed failures: ReservationRefused with a literal reason.
  const refused = yield* Effect.flip(store.submitResult({ ...auth, fence: a.fence + 1, outcome: "clean", finalPhase: null, body: "{}" }))
  console.log(`refused: ${refused._tag} ${refused._tag === "ReservationRefused" ? refused.reason : ""}`)
})

await Effect.runPromise(program.pipe(Effect.provide(Database.layer(`sqlite:${join(mkdtempSync(join(tmpdir(), "scanfleet-")), "queue.db")}`))))
