import { describe, expect, it } from "@effect/vitest"
import Sqlite from "better-sqlite3"
import { Effect } from "effect"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Priority, Store } from "@scanfleet/core"
import * as SqliteStore from "../src/SqliteStore.js"

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
