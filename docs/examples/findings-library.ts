// file: docs/examples/findings-library.ts
import { SqliteStore } from "@scanfleet/adapters"
import { Config, FindingStore, Findings, Store } from "@scanfleet/core"
import { Redaction } from "@scanfleet/worker"
import { Chunk, Effect, Stream } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

// The fleet key: a server hands it to its devices (GET /v1/device/fleet-key); here, a fixed one.
const fleetKey = "11".repeat(32)

// What gitleaks prints for one leak, redacted on the device before it goes anywhere.
const leak = (secret: string, file: string) =>
  Findings.AcceptedSchema.parse(
    Redaction.redact(fleetKey, "gitleaks", Findings.fieldMaps.gitleaks, { RuleID: "generic-api-key", Secret: secret, Match: `api_key = "${secret}"`, File: file, StartLine: 3, Commit: "4b825dc" })
  )

const scan = (secrets: ReadonlyArray<[string, string]>, at: number) =>
  Effect.gen(function* () {
    const store = yield* Store.Store
    const device = (yield* store.deviceByTokenHash("example")) ?? (yield* store.addDevice({ name: "d1", slots: 1, tokenHash: "example", now: at }))
    yield* store.recordObservations([{ source: "github", identity: "acme/api", remoteAt: at - 1000 }], at)
    yield* store.promote("github", { budget: 10, cooldownMs: 0 }, at)
    const a = yield* store.claim({ deviceId: device.id, slot: 0, now: at, config: Config.defaults })
    if (a === null) return yield* Effect.dieMessage("nothing to scan")
    const body = JSON.stringify({ findings: secrets.map(([s, f]) => leak(s, f)), log: "" })
    yield* store.submitResult({ deviceId: device.id, reservationId: a.reservationId, fence: a.fence, now: at + 10, outcome: "findings", finalPhase: "awaiting_receipt", body })
    return a.reservationId
  })

const program = Effect.gen(function* () {
  const findings = yield* FindingStore.FindingStore
  const now = Date.now()
  const first = yield* scan([["fake-key-aaaa-1111-EXAMPLE", "config/a.env"], ["fake-key-bbbb-2222-EXAMPLE", "config/b.env"]], now)
  // a commit removes b and adds c
  const second = yield* scan([["fake-key-aaaa-1111-EXAMPLE", "config/a.env"], ["fake-key-cccc-3333-EXAMPLE", "config/c.env"]], now + 60_000)
  console.log(yield* findings.scan(first)) // { new: 2, present: 0, resolved: 0, ... }
  const summary = yield* findings.scan(second)
  console.log(summary) // { new: 1, present: 1, resolved: 1, ... }
  if (summary?.new !== 1 || summary.present !== 1 || summary.resolved !== 1) throw new Error("unexpected summary")
  const page = yield* findings.list({ source: "github", status: "resolved", limit: 10 })
  console.log(page.findings.map((f) => `${f.path} ${f.preview} ${f.fingerprint.slice(0, 20)}…`)) // [ 'config/b.env fake…(26) hmac-sha256:…' ]
  // the outbox as a Stream: both scans changed something, so two events
  const events = yield* FindingStore.changes({ pollInterval: "50 millis" }).pipe(Stream.take(2), Stream.runCollect)
  console.log(Chunk.toReadonlyArray(events).map((e) => e.findings.map((x) => `${x.change} ${x.path}`)))
  // SARIF 2.1.0 of everything
  const log = Findings.toSarif((yield* findings.list({ limit: 100 })).findings, { name: "scanfleet", version: "2" })
  console.log(log.runs[0].results.map((r) => [r.ruleId, r.baselineState]))
})

const filename = join(mkdtempSync(join(tmpdir(), "scanfleet-findings-")), "fleet.db")
await Effect.runPromise(program.pipe(Effect.provide(SqliteStore.layer({ filename }))))
