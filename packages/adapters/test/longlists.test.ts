import { describe, expect, it } from "@effect/vitest"
import Sqlite from "better-sqlite3"
import { Effect, Redacted } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import pg from "pg"
import { inject } from "vitest"
import { FindingStore, Operations, Store } from "@scanfleet/core"
import * as PgStore from "../src/PgStore.js"
import * as SqliteStore from "../src/SqliteStore.js"
import { schema, urlFor } from "./support/PgSchema.js"

/**
 * Reads whose lists of ids grow with the data, past what one statement can carry as a parameter
 * per id (65,535 on PostgreSQL's protocol, 32,766 variables on SQLite): every device's live
 * reservations (a target's findings are read in pages of up to 10,000 with their events). Rows are written with one raw
 * statement each, then read through the store.
 */

const N = 70_000
const T0 = Date.UTC(2025, 0, 1)

// The raw statements that fill a store's schema: N devices, and N findings with one event each on
// target `targetId`. `FROM g` is the series 1..N (column n), which each dialect writes its own way.
const fill = (targetId: number) => [
  `INSERT INTO devices (name, slots, token_hash, created_at) SELECT 'bulk-' || n, 1, 'h-' || n, ${T0} FROM g`,
  `INSERT INTO findings (target_id, source, identity, detector, path, fingerprint, preview, status, first_seen_at, last_seen_at, details)
     SELECT ${targetId}, 'github', 'bulk/findings', 'd', 'p/' || n, 'hmac-sha256:' || n, '', 'new', ${T0}, ${T0}, '{}' FROM g`,
  `INSERT INTO finding_events (finding_id, reservation_id, kind, revision, at) SELECT id, 1, 'new', NULL, ${T0} FROM findings`
]

const check = (write: (statements: ReadonlyArray<string>) => Effect.Effect<void>) =>
  Effect.gen(function* () {
    const store = yield* Store.Store
    yield* store.recordObservations([{ source: "github", identity: "bulk/findings", remoteAt: null }], T0)
    const target = yield* store.getTarget("github", "bulk/findings")
    yield* write(fill(target.id))
    const devices = yield* Effect.flatMap(Operations.Operations, (o) => o.listDevices())
    expect(devices.length).toBe(N)
    expect(devices.every((d) => d.active.length === 0)).toBe(true)
    // a target's findings are read a page at a time, each page's events by the page's ids
    const f = yield* FindingStore.FindingStore
    const t = { findings: 0, events: new Set<number>() }
    for (let after: number | null = 0; after !== null; ) {
      const p: FindingStore.TargetFindings = yield* f.forTarget({ source: "github", identity: "bulk/findings", after, limit: 10_000 })
      expect(p.findings.length).toBeLessThanOrEqual(10_000)
      t.findings += p.findings.length
      for (const e of p.events) t.events.add(e.findingId)
      after = p.next
    }
    expect(t.findings).toBe(N)
    expect(t.events.size).toBe(N)
  })

describe("reads over more ids than a statement has parameters", () => {
  it.live(
    "PostgreSQL: 70,000 devices are listed and a target's 70,000 findings read with their events, page by page",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const url = inject("pgUrl")
          const name = yield* schema(url)
          const at = urlFor(url, name)
          const write = (statements: ReadonlyArray<string>) =>
            Effect.promise(async () => {
              const client = new pg.Client({ connectionString: at })
              await client.connect()
              try {
                for (const s of statements) await client.query(s.replace(/FROM g$/, `FROM generate_series(1, ${N}) AS g(n)`))
              } finally {
                await client.end()
              }
            })
          yield* check(write).pipe(Effect.provide(PgStore.layer({ url: Redacted.make(at) })))
        })
      ),
    120_000
  )

  it.live(
    "SQLite: 70,000 devices are listed and a target's 70,000 findings read with their events, page by page",
    () =>
      Effect.acquireUseRelease(
        Effect.sync(() => mkdtempSync(join(tmpdir(), "scanfleet-longlists-"))),
        (dir) => {
          const filename = join(dir, "store.db")
          const write = (statements: ReadonlyArray<string>) =>
            Effect.sync(() => {
              const db = new Sqlite(filename)
              try {
                db.pragma("busy_timeout = 10000")
                for (const s of statements)
                  db.exec(s.replace(/FROM g$/, `FROM (WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ${N}) SELECT n FROM g)`))
              } finally {
                db.close()
              }
            })
          return check(write).pipe(Effect.provide(SqliteStore.layer({ filename })))
        },
        (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
      ),
    120_000
  )
})
