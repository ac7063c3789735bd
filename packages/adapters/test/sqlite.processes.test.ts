import { execFile } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { promisify } from "node:util"
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { Store } from "@scanfleet/core"
import * as SqliteStore from "../src/SqliteStore.js"

const run = promisify(execFile)
const claimer = fileURLToPath(new URL("./support/SqliteClaimer.ts", import.meta.url))

describe("sqlite shared by several processes", () => {
  it.live("processes claiming and releasing in one file at once never take a target twice and never fail on the lock", () =>
    Effect.gen(function* () {
      const filename = join(mkdtempSync(join(tmpdir(), "scanfleet-procs-")), "shared.db")
      const devices = yield* Effect.gen(function* () {
        const store = yield* Store.Store
        yield* store.recordObservations(Array.from({ length: 100 }, (_, i) => ({ source: "github" as const, identity: `shared/${i}`, remoteAt: null })), 1)
        return yield* Effect.forEach([0, 1, 2], (i) => store.addDevice({ name: `p${i}`, slots: 10, tokenHash: `p${i}`, now: 1 }))
      }).pipe(Effect.provide(SqliteStore.layer({ filename })))
      const outputs = yield* Effect.promise(() =>
        Promise.all(
          devices.map((d) =>
            run(process.execPath, ["--conditions=@scanfleet/source", "--import", "tsx", claimer, filename, String(d.id), "10", "5"], { timeout: 60_000 })
          )
        )
      )
      const results = outputs.map((o) => JSON.parse(o.stdout) as { won: Array<string>; refused: Array<string> })
      for (const r of results) expect(r.refused).toEqual([])
      const won = results.flatMap((r) => r.won)
      expect(won).toHaveLength(30)
      expect(new Set(won).size).toBe(30)
      // while they raced, every release and claim kept one live reservation per target
      const active = yield* Effect.flatMap(Store.Store, (s) => s.listAssignments({ state: "active", limit: 1000 })).pipe(Effect.provide(SqliteStore.layer({ filename })))
      expect(new Set(active.map((a) => a.targetId)).size).toBe(30)
      const counts = yield* Effect.flatMap(Store.Store, (s) => s.countTargets()).pipe(Effect.provide(SqliteStore.layer({ filename })))
      expect(counts).toEqual([
        { source: "github", status: "in_progress", count: 30 },
        { source: "github", status: "pending", count: 70 }
      ])
    }), 90_000)
})
