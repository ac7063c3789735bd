import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import pg from "pg"
import { inject } from "vitest"
import { Config } from "@scanfleet/core"
import * as PgStore from "../src/PgStore.js"
import { marker } from "../src/internal/Prepared.js"
import { PreparingClient } from "../src/internal/PreparingClient.js"
import { schema, urlFor } from "./support/PgSchema.js"

const T0 = Date.UTC(2025, 0, 1)

// One connection, so the session that ran the store's statements is the one asked.
const preparedAfterWork = (options: PgStore.PoolOptions) =>
  Effect.gen(function* () {
    const name = yield* schema(inject("pgUrl"))
    const ctx = yield* Layer.build(PgStore.clientLayer({ url: Redacted.make(urlFor(inject("pgUrl"), name)), maxConnections: 1 }, options))
    const store = yield* Effect.provide(PgStore.make, ctx)
    const sql = yield* Effect.provide(SqlClient.SqlClient, ctx)
    yield* store.recordObservations(Array.from({ length: 20 }, (_, i) => ({ source: "github" as const, identity: `p/${i}`, remoteAt: null })), T0)
    const d = yield* store.addDevice({ name: "d", slots: 1, tokenHash: "h", now: T0 })
    for (let i = 0; i < 10; i++) {
      const a = yield* store.claim({ deviceId: d.id, slot: 0, now: T0 + i, config: Config.defaults })
      expect(a?.identity).toBe(`p/${i}`)
      yield* store.submitResult({ deviceId: d.id, reservationId: a!.reservationId, fence: a!.fence, now: T0 + i, outcome: "clean", finalPhase: null, body: "{}" })
    }
    return yield* sql<{ name: string; statement: string; calls: number }>`
      SELECT name, statement, generic_plans + custom_plans AS calls FROM pg_prepared_statements ORDER BY name`
  }).pipe(Effect.scoped)

describe("prepared hot statements on PostgreSQL", () => {
  it.live("the claim and the result run as named prepared statements, each parsed once per connection", () =>
    Effect.gen(function* () {
      const rows = yield* preparedAfterWork({})
      const hot = rows.filter((r) => r.name.startsWith("sf_"))
      expect(hot.every((r) => r.statement.startsWith(marker))).toBe(true)
      expect(hot.some((r) => r.statement.includes("INSERT INTO assignments"))).toBe(true)
      expect(hot.some((r) => r.statement.includes("INSERT INTO duration_pending"))).toBe(true)
      // ten claims and ten results reused the two statements
      expect(hot.filter((r) => Number(r.calls) >= 10).length).toBeGreaterThanOrEqual(2)
    }), 60_000)

  it.live("with prepare: false nothing is prepared", () =>
    Effect.gen(function* () {
      expect(yield* preparedAfterWork({ prepare: false })).toEqual([])
    }), 60_000)

  it("a connection keeps at most 64 prepared statements; past that, marked statements run unnamed and still answer", async () => {
    const client = new PreparingClient({ connectionString: inject("pgUrl") })
    await client.connect()
    try {
      for (let i = 0; i < 80; i++) {
        const r = await new Promise<pg.QueryResult>((resolve, reject) =>
          client.query(`${marker}SELECT ${i}::int AS n, $1::text AS t`, ["x"], (err: Error | null, res: pg.QueryResult) => (err ? reject(err) : resolve(res)))
        )
        expect(r.rows).toEqual([{ n: i, t: "x" }])
      }
      const { rows } = await client.query("SELECT count(*)::int AS n FROM pg_prepared_statements WHERE name LIKE 'sf\\_%'")
      expect(rows[0].n).toBe(64)
    } finally {
      await client.end()
    }
  })

  it("a statement is prepared again each time its runs double from 16, so a plan made on an empty table does not outlive the table's growth", async () => {
    const client = new PreparingClient({ connectionString: inject("pgUrl") })
    await client.connect()
    const table = `grows_${process.pid}_${Date.now()}`
    const text = `${marker}SELECT v FROM ${table} WHERE id = ANY ($1::int[])`
    const run = (ids: ReadonlyArray<number>) =>
      new Promise<pg.QueryResult>((resolve, reject) => client.query(text, [ids], (err: Error | null, res: pg.QueryResult) => (err ? reject(err) : resolve(res))))
    // The plan of the one prepared statement of this text, as PostgreSQL would run it now.
    const plan = async () => {
      const { rows } = await client.query("SELECT name FROM pg_prepared_statements WHERE statement = $1", [text])
      expect(rows.length).toBe(1) // the superseded generation was deallocated
      const explained = await client.query(`EXPLAIN EXECUTE "${rows[0].name}"('{1,2}')`)
      return explained.rows.map((r: Record<string, string>) => r["QUERY PLAN"]).join("\n")
    }
    try {
      await client.query(`CREATE TABLE ${table} (id int PRIMARY KEY, v text) WITH (autovacuum_enabled = false)`)
      await client.query(`INSERT INTO ${table} VALUES (1, 'a'), (2, 'b')`)
      await client.query(`ANALYZE ${table}`)
      for (let i = 0; i < 8; i++) expect((await run([1, 2])).rows.length).toBe(2)
      expect(await plan()).toContain("Seq Scan")
      // The table grows a thousandfold without an analyse, as a fresh fleet's reservations do in their first minute.
      await client.query(`INSERT INTO ${table} SELECT g, 'x' FROM generate_series(3, 200000) g`)
      for (let i = 0; i < 16; i++) expect((await run([1, 2])).rows.length).toBe(2)
      expect(await plan()).toContain(`Index Scan using ${table}_pkey`)
    } finally {
      await client.query(`DROP TABLE IF EXISTS ${table}`)
      await client.end()
    }
  })
})
