// file: docs/examples/promise-queue.ts
import { openFleet } from "@scanfleet/adapters"
import { Errors } from "@scanfleet/core"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

// An existing scanner: a plain async function from a repository to findings. It knows nothing of the queue.
const scanRepository = async (identity: string): Promise<Array<{ detector: string; file: string }>> => {
  await new Promise((resolve) => setTimeout(resolve, 10))
  return identity.endsWith("-leaky") ? [{ detector: "AWSAccessKey", file: "config/.env" }] : []
}

const fleet = await openFleet({ database: `sqlite:${join(mkdtempSync(join(tmpdir(), "scanfleet-")), "queue.db")}` })
try {
  // Discovery (yours, or scanfleet's source clients) records what it saw; new identities are queued.
  const now = Date.now()
  await fleet.recordObservations([
    { source: "github", identity: "octo/app", remoteAt: now - 3_600_000 },
    { source: "github", identity: "octo/infra-leaky", remoteAt: now - 60_000 }
  ])
  // The scanner is one device with one slot; the store keeps only a hash of a device's token.
  const device = await fleet.store.addDevice({ name: "my-scanner", slots: 1, tokenHash: "sha256-of-the-device-token", now })

  for (;;) {
    const a = await fleet.claim({ deviceId: device.id, slot: 0 })
    if (a === null) break
    const auth = { deviceId: device.id, reservationId: a.reservationId, fence: a.fence }
    await fleet.progress(auth, [{ seq: 1, kind: "phase", phase: "assigned", at: Date.now() }])
    const findings = await scanRepository(a.identity)
    const receipt = await fleet.submitResult({ ...auth, outcome: findings.length > 0 ? "findings" : "clean", finalPhase: "assigned", body: JSON.stringify({ findings }) })
    console.log(`${a.identity}: ${receipt.outcome} (receipt ${receipt.receiptId}); scan deadline ${new Date(a.scanDeadline).toISOString()}`)

    // A write with a superseded fence is refused with the port's own error class and reason.
    try {
      await fleet.submitResult({ ...auth, fence: a.fence + 1, outcome: "clean", finalPhase: null, body: "{}" })
    } catch (e) {
      if (!(e instanceof Errors.ReservationRefused)) throw e
      console.log(`refused: ${e.reason}`)
    }
  }
} finally {
  await fleet.close()
}
