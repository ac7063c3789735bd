import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Migrator as SqlMigrator, SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { describe, expect, it } from "@effect/vitest"
import { type Assignment, Config, Deadline, type Errors, type Source, type Store } from "@scanfleet/core"
import { Effect, Layer, Redacted, type Scope } from "effect"
import { inject } from "vitest"
import * as Migrator from "../src/Migrator.js"
import * as PgStore from "../src/PgStore.js"
import * as SqliteStore from "../src/SqliteStore.js"
import * as Codec from "../src/internal/Codec.js"
import * as Policies from "../src/internal/Policies.js"
import { schema, urlFor } from "./support/PgSchema.js"

type Row = Record<string, unknown>

const T0 = Date.UTC(2025, 0, 1)
const config = Config.defaults
// Only github's policy differs from the defaults'.
const other: Config.ManagedConfig = { ...config, sources: { ...config.sources, github: { ...config.sources.github, scanTimeoutSeconds: 900 } } }

// A database holding two stores' worth of connections: PostgreSQL pools on one fresh schema, or SQLite connections to one file.
interface Shared {
  readonly stores: ReadonlyArray<Store.StoreShape>
  readonly sql: SqlClient.SqlClient
}

const pgShared = (n: number) =>
  Effect.gen(function* () {
    const url = urlFor(inject("pgUrl"), yield* schema(inject("pgUrl")))
    const clients = []
    for (let i = 0; i < n; i++) clients.push(yield* Layer.build(PgClient.layer({ url: Redacted.make(url), types: PgStore.types, maxConnections: 4 })))
    const stores = []
    for (const c of clients) stores.push(yield* Effect.provide(PgStore.make, c))
    return { stores, sql: yield* Effect.provide(SqlClient.SqlClient, clients[0]) } satisfies Shared
  })

const sqliteFile = Effect.acquireRelease(
  Effect.sync(() => mkdtempSync(join(tmpdir(), "scanfleet-policies-"))),
  (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
)

const sqliteShared = (n: number) =>
  Effect.gen(function* () {
    const file = join(yield* sqliteFile, "store.db")
    const stores = []
    let sql: SqlClient.SqlClient | undefined
    for (let i = 0; i < n; i++) {
      const ctx = yield* Layer.build(SqliteStore.clientLayer({ filename: file }))
      stores.push(yield* Effect.provide(SqliteStore.make, ctx))
      sql ??= yield* Effect.provide(SqlClient.SqlClient, ctx)
    }
    return { stores, sql: sql! } satisfies Shared
  })

const policyCounts = (sql: SqlClient.SqlClient) =>
  Effect.map(sql<Row>`SELECT source, count(*) AS n FROM policies GROUP BY source ORDER BY source`, (rows) => Object.fromEntries(rows.map((r) => [String(r.source), Number(r.n)])))

const interning = (shared: Effect.Effect<Shared, unknown, Scope.Scope>) =>
  Effect.scoped(
    Effect.gen(function* () {
      const { stores, sql } = yield* shared
      const [one, two] = stores
      const identities = Array.from({ length: 16 }, (_, i) => `o/${i}`)
      yield* one.recordObservations(identities.map((identity) => ({ source: "github" as const, identity, remoteAt: null })), T0)
      const devices: Array<Store.Device> = []
      for (const s of stores) devices.push(yield* s.addDevice({ name: `d${devices.length}`, slots: 8, tokenHash: `h${devices.length}`, now: T0 }))
      // Both stores' first claims under the configuration at once: each interns it, none waits for the other.
      const claims = yield* Effect.all(
        stores.flatMap((s, k) => Array.from({ length: 4 }, (_, slot) => s.claim({ deviceId: devices[k].id, slot, now: T0, config }))),
        { concurrency: "unbounded" }
      )
      expect(claims.every((a) => a !== null)).toBe(true)
      expect(yield* policyCounts(sql)).toEqual({ dockerhub: 1, github: 1, gitlab: 1, huggingface: 1 })
      // A configuration that changes only github's policy adds only github's row, from either store.
      const more = yield* Effect.all(
        stores.map((s, k) => s.claimMany({ deviceId: devices[k].id, slots: [4, 5], now: T0 + 1, config: other })),
        { concurrency: "unbounded" }
      )
      expect(yield* policyCounts(sql)).toEqual({ dockerhub: 1, github: 2, gitlab: 1, huggingface: 1 })
      // Each reservation reads back its own configuration's policy, from the other store too.
      for (const [a, cfg] of [...claims.map((a) => [a!, config] as const), ...more.flat().map((a) => [a, other] as const)]) {
        expect(a.policy).toEqual(Config.effectivePolicy(cfg, a.source))
        expect(yield* two.getAssignment(a.reservationId)).toEqual(a)
        expect(yield* one.getAssignment(a.reservationId)).toEqual(a)
      }
      const ids = yield* sql<Row>`SELECT DISTINCT policy_id FROM assignments`
      expect(ids.length).toBe(2)
    })
  )

// Reservations written at schema 0011 (each with its policy copied in), read back after 0012.
const upgrade = <R>(dialect: Migrator.Dialect, client: Layer.Layer<SqlClient.SqlClient | R, unknown>, make: Effect.Effect<Store.StoreShape, Errors.StoreError, SqlClient.SqlClient | R>) =>
  Effect.provide(
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const upTo11 = Migrator.ids(dialect).filter((id) => Number(id.slice(0, 4)) <= 11)
      const record: Record<string, Effect.Effect<void, unknown, SqlClient.SqlClient>> = {}
      for (const id of upTo11) record[id] = ((yield* Effect.promise(() => import(`../src/migrations/${dialect}/${id}.ts`))) as { default: Effect.Effect<void, unknown, SqlClient.SqlClient> }).default
      expect((yield* SqlMigrator.make({})({ loader: SqlMigrator.fromRecord(record), table: Migrator.table })).map(([id]) => id)).toEqual(Array.from({ length: 11 }, (_, i) => i + 1))
      const json = (v: unknown) => (dialect === "pg" ? sql`${JSON.stringify(v)}::jsonb` : sql`${JSON.stringify(v)}`)
      const [d] = yield* sql<Row>`INSERT INTO devices (name, slots, token_hash, created_at) VALUES ('old', 4, 'h', ${T0}) RETURNING id`
      const withOverride: Config.ManagedConfig = { ...config, assignments: { ...config.assignments, overrides: { dockerhub: { ttlSeconds: 7200 } } } }
      const rows: ReadonlyArray<readonly [Source.Source, string, Config.ManagedConfig, Assignment.State, number]> = [
        ["github", "a", config, "completed", 0],
        ["github", "b", other, "active", 0],
        ["github", "c", config, "released", 1],
        ["dockerhub", "x", withOverride, "expired", 1],
        ["dockerhub", "y", config, "failed", 2],
        ["gitlab", "g", config, "active", 1]
      ]
      let k = 0
      for (const [source, identity, cfg, state, slot] of rows) {
        const at = T0 + k++ * 1000
        const [t] = yield* sql<Row>`INSERT INTO targets (source, identity, status, observed_remote_at, discovered_at) VALUES (${source}, ${identity}, 'in_progress', NULL, ${T0}) RETURNING id`
        const { policy, deadlines } = Deadline.issueFor(cfg, source, at)
        const ended = state === "active" ? null : at + 500
        yield* sql`
          INSERT INTO assignments (target_id, source, identity, device_id, device_slots, slot, fence, policy, covered_remote_at, issued_at, scan_deadline, upload_deadline,
            expires_at, state, last_phase, last_seq, last_progress_at, outcome, final_phase, ended_at, expired_at, expiry_last_phase, expiry_last_progress_at, result_body)
          VALUES (${Number(t.id)}, ${source}, ${identity}, ${Number(d.id)}, 4, ${slot}, 1, ${json(policy)}, NULL, ${at}, ${deadlines.scanDeadline}, ${deadlines.uploadDeadline},
            ${deadlines.expiresAt}, ${state}, ${state === "active" ? null : "scanning"}, ${state === "active" ? 0 : 3}, ${ended}, ${state === "completed" || state === "failed" ? "clean" : null},
            ${state === "completed" || state === "failed" ? "awaiting_receipt" : null}, ${ended}, ${state === "expired" ? ended : null}, ${state === "expired" ? "scanning" : null},
            ${state === "expired" ? ended : null}, ${state === "completed" ? "{}" : null})`
      }
      const before = (yield* sql<Row>`SELECT * FROM assignments ORDER BY reservation_id DESC`).map(Codec.assignment)
      expect(before.map((a) => a.policy.ttlSeconds)).toEqual([3600, 3600, 7200, 3600, 3600, 3600])

      // 0012 and every migration after it
      const ran = yield* Migrator.migrate(dialect)
      expect(ran[0]).toEqual([12, "policy_ref"])
      expect(ran.map(([id]) => id)).toEqual(Migrator.ids(dialect).map((id) => Number(id.slice(0, 4))).filter((id) => id >= 12))
      const store = yield* make
      expect(yield* store.listAssignments({ limit: 10 })).toEqual(before)
      for (const a of before) expect(yield* store.getAssignment(a.reservationId)).toEqual(a)
      // one row per distinct (source, policy), with core's offsets
      const stored = yield* sql<Row>`SELECT source, policy, scan_ms, upload_ms, expiry_ms FROM policies ORDER BY id`
      expect(stored.length).toBe(5)
      for (const r of stored) expect({ scanMs: Number(r.scan_ms), uploadMs: Number(r.upload_ms), expiryMs: Number(r.expiry_ms) }).toEqual(Policies.offsets(Codec.json(r.policy)))
      // A claim under the configuration most reservations had reuses their rows: only the sources no old reservation had get one.
      yield* store.recordObservations([{ source: "github", identity: "new", remoteAt: null }], T0)
      const fresh = yield* store.claim({ deviceId: Number(d.id), slot: 3, now: T0 + 10_000, config })
      expect(fresh).toMatchObject({ identity: "new", policy: Config.effectivePolicy(config, "github") })
      expect(yield* policyCounts(sql)).toEqual({ dockerhub: 2, github: 2, gitlab: 1, huggingface: 1 })
      expect(yield* store.getAssignment(fresh!.reservationId)).toEqual(fresh)
    }),
    client
  )

describe("policies: stored once, referenced by reservations", () => {
  it.live("postgres: two stores on one database intern one row per source policy, and each claim keeps its configuration's policy", () => interning(pgShared(2)), 60_000)
  it.live("sqlite: two stores on one file intern one row per source policy, and each claim keeps its configuration's policy", () => interning(sqliteShared(2)), 60_000)

  it.live("sqlite: a claim rolled back after interning its configuration's policies (its client's deadline passed) leaves no row and no remembered id", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { stores, sql } = yield* sqliteShared(1)
        const [store] = stores
        yield* store.recordObservations([{ source: "gitlab", identity: "g/1", remoteAt: null }], T0)
        const d = yield* store.addDevice({ name: "late", slots: 1, tokenHash: "h", now: T0 })
        const late = yield* Effect.either(store.claim({ deviceId: d.id, slot: 0, now: T0, config, notAfter: Date.now() - 1 }))
        expect(late).toMatchObject({ _tag: "Left", left: { _tag: "ClaimRejected", reason: "deadline_passed" } })
        expect(yield* policyCounts(sql)).toEqual({})
        const a = yield* store.claim({ deviceId: d.id, slot: 0, now: T0, config })
        expect(a).toMatchObject({ identity: "g/1", policy: Config.effectivePolicy(config, "gitlab") })
        expect(yield* store.getAssignment(a!.reservationId)).toEqual(a)
        expect(yield* policyCounts(sql)).toEqual({ dockerhub: 1, github: 1, gitlab: 1, huggingface: 1 })
      })
    ), 60_000)
  it.live("postgres: migration 0012 gives reservations stored at 0011 their policies back unchanged", () =>
    upgrade("pg", Layer.unwrapScoped(Effect.map(schema(inject("pgUrl")), (name) => PgClient.layer({ url: Redacted.make(urlFor(inject("pgUrl"), name)), types: PgStore.types }))), PgStore.make), 60_000)
  it.live("sqlite: migration 0012 gives reservations stored at 0011 their policies back unchanged", () =>
    upgrade("sqlite", Layer.unwrapScoped(Effect.map(sqliteFile, (dir) => SqliteStore.clientLayer({ filename: join(dir, "store.db") }))), SqliteStore.make), 60_000)
})
