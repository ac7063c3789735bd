import { describe, expect, it } from "@effect/vitest"
import Sqlite from "better-sqlite3"
import { Context, Effect, Layer } from "effect"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Priority, Store } from "@scanfleet/core"
import * as Rollups from "../src/internal/Rollups.js"
import * as SqliteStore from "../src/SqliteStore.js"

const DAY = 86_400_000
const schemaDump = (dialect: "pg" | "sqlite") => readFileSync(new URL(`../schema/${dialect}.sql`, import.meta.url), "utf8")

describe("the claim order's index matches core's claim key", () => {
  it("both schema dumps index exactly Priority.claimKeySql, then id, over pending targets", () => {
    expect(schemaDump("sqlite")).toContain(`CREATE INDEX targets_claim_idx ON targets ((${Priority.claimKeySql("c").replaceAll("c.", "")}), id) WHERE status = 'pending'`)
    expect(schemaDump("pg")).toContain(`CREATE INDEX targets_claim_idx ON targets USING btree (((id - (priority * ${Priority.step}))), id) WHERE (status = 'pending'::text)`)
  })

  it.live("on a migrated SQLite file the claim's candidate query reads targets_claim_idx, unfiltered and filtered by source (plans are printed)", () =>
    Effect.gen(function* () {
      const dir = mkdtempSync(join(tmpdir(), "scanfleet-plan-"))
      const file = join(dir, "store.db")
      // migrate through the store itself
      yield* Effect.scoped(Effect.flatMap(Store.Store, (s) => s.countTargets()).pipe(Effect.provide(SqliteStore.layer({ filename: file }))))
      const db = new Sqlite(file, { readonly: true })
      try {
        const order = `${Priority.claimKeySql("c")}, c.id`
        const plans = [
          [`SELECT c.id FROM targets c WHERE c.status = 'pending' ORDER BY ${order} LIMIT 1`, {}],
          // the filtered pick's form (sqlite/Hot.ts): the source list is a parameter that may be null
          [`SELECT c.id FROM targets c WHERE c.status = 'pending' AND (@sources IS NULL OR c.source IN (SELECT value FROM json_each(@sources))) ORDER BY ${order} LIMIT 1`, { sources: '["github"]' }]
        ].map(([q, params]) => (db.prepare(`EXPLAIN QUERY PLAN ${q as string}`).all(params) as Array<{ detail: string }>).map((r) => r.detail).join(" | "))
        console.log(plans.join("\n"))
        for (const p of plans) {
          expect(p).toContain("USING INDEX targets_claim_idx")
          expect(p).not.toContain("TEMP B-TREE")
        }
      } finally {
        db.close()
        rmSync(dir, { recursive: true, force: true })
      }
    })
  )
})

describe("the percentile read's index matches its windows", () => {
  it.live("on a migrated SQLite file a percentile window whose edges fall mid-hour searches each stretch of the rollups by span and a range of start, and the raw edges by a range of time, whether it names a source or not (plans are printed)", () =>
    Effect.gen(function* () {
      const dir = mkdtempSync(join(tmpdir(), "scanfleet-plan-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
      const context = yield* Layer.build(SqliteStore.layer({ filename: join(dir, "store.db") }))
      const store = Context.get(context, Store.Store)
      const { db } = Context.get(context, SqliteStore.Database)
      // 20,000 durations over thirty days, every source, metric and outcome
      const sources = ["github", "gitlab", "huggingface", "dockerhub"] as const
      const metrics = ["end_to_end", "scanning", "cleanup", "bundling", "upload"] as const
      const outcomes = ["clean", "findings", "scan_error"] as const
      const end = Date.UTC(2026, 5, 1)
      yield* store.recordDurations(
        Array.from({ length: 20_000 }, (_, i) => ({
          source: sources[i % 4],
          metric: metrics[(i >> 2) % 5],
          outcome: outcomes[(i >> 4) % 3],
          ms: 1 + ((i * 7919) % 100_000),
          at: end - 1 - ((i * 104_729) % (30 * DAY))
        }))
      )
      // every statement the store prepares from here on
      const prepared: Array<string> = []
      const prepare = db.prepare.bind(db)
      db.prepare = ((text: string) => {
        prepared.push(text)
        return prepare(text)
      }) as typeof db.prepare
      // edges 39 and 20 minutes past a ten-minute mark, in the last week: whole days, with an hour and
      // ten minutes added or taken away at the edges, and raw rows at both
      const window = { from: end - 7 * DAY + 2_345_678, to: end - 1_234_567, minSamples: 1 }
      const queries: ReadonlyArray<Store.PercentileQuery> = [window, { ...window, source: "dockerhub" }]
      for (const q of queries) {
        const from = prepared.length
        expect((yield* store.percentiles(q)).length).toBeGreaterThan(0)
        const read = prepared.slice(from).filter((t) => t.includes("FROM duration_rollups"))
        expect(read).toHaveLength(1)
        // the plan does not depend on the values; every placeholder bound to null
        const params = Array.from({ length: (read[0].match(/\?/g) ?? []).length }, () => null)
        const plan = (prepare(`EXPLAIN QUERY PLAN ${read[0]}`).all(...params) as Array<{ detail: string }>).map((r) => r.detail)
        console.log(`percentiles ${q.source ?? "over every source"}:\n${plan.join("\n")}`)
        const rollups = plan.filter((d) => d.includes("duration_rollups"))
        // one search for each stretch of rollups the window's plan reads
        const parts = Rollups.plan(q.from, q.to)
        expect(rollups.length).toBe(parts.filter((p) => p._tag === "rollup").length)
        // the old key, led by the groups, bounded each search by span alone, or by span and source:
        // every stretch read every rollup of its span, whatever the window
        for (const d of rollups) expect(d).toMatch(/^SEARCH duration_rollups USING PRIMARY KEY \(span=\? AND start>\? AND start<\?\)$/)
        // and the raw durations at the two edges are a range of time, of the named source when there is one
        // (the old index, led by source, metric and outcome, was searched by source alone: all of its history)
        const edges = plan.filter((d) => /\bdurations\b/.test(d))
        expect(edges).toHaveLength(parts.filter((p) => p._tag === "raw").length)
        for (const d of edges) expect(d).toMatch(q.source ? /^SEARCH durations USING INDEX durations_source_idx \(source=\? AND at>\? AND at<\?\)$/ : /^SEARCH durations USING INDEX durations_window_idx \(at>\? AND at<\?\)$/)
      }
    }).pipe(Effect.scoped), 60_000)
})
