import { Effect } from "effect"
import { Config, type Errors, Store } from "@scanfleet/core"

type Refusal = Errors.StoreError | Errors.ClaimRejected | Errors.ReservationRefused | Errors.ProgressRejected

/** The program the adapter pages show: discover, claim, report progress, complete. */
export const program: Effect.Effect<string, Refusal, Store.Store> = Effect.gen(function* () {
  const store = yield* Store.Store
  const now = Date.now()
  // discovery records what it saw; new identities become pending targets
  yield* store.recordObservations([{ source: "github", identity: "octo/hello", remoteAt: now - 60_000 }], now)
  // a worker device with two slots claims one assignment
  const device = yield* store.addDevice({ name: "scanner-1", slots: 2, tokenHash: "sha256-of-its-token", now })
  const a = yield* store.claim({ deviceId: device.id, slot: 0, now, config: Config.defaults })
  if (a === null) return "nothing to do"
  const auth = { deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now }
  yield* store.appendProgress(auth, [{ seq: 1, kind: "phase", phase: "assigned", at: now }])
  const receipt = yield* store.submitResult({ ...auth, outcome: "clean", finalPhase: "assigned", body: "{}" })
  return `${a.identity}: ${receipt.outcome} (${receipt.receiptId})`
})
