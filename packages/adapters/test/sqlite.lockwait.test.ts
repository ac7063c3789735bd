import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit } from "effect"
import { Store } from "@scanfleet/core"
import * as SqliteStore from "../src/SqliteStore.js"

const require = createRequire(import.meta.url)

/**
 * How long the SQLite store waits for a write lock another process holds. A server under
 * load with the lock held past the busy timeout (the turn at the lock lost, the sweeper
 * stuck) is `packages/server-example/test/SqliteLockRecovery.test.ts`.
 */

/** Another process that takes the file's write lock and holds it `ms`: resolves once it holds it, with a promise of its release. */
const holdWriteLock = (file: string, ms: number) =>
  new Promise<{ readonly child: ChildProcess; readonly released: Promise<void> }>((resolve, reject) => {
    const code = `const S = require(${JSON.stringify(require.resolve("better-sqlite3"))}); const db = new S(${JSON.stringify(file)}, { timeout: 10000 });
      db.exec("BEGIN IMMEDIATE"); process.stdout.write("held\\n"); setTimeout(() => { db.exec("ROLLBACK"); db.close(); process.exit(0) }, ${ms})`
    const child = spawn(process.execPath, ["-e", code], { stdio: ["ignore", "pipe", "inherit"] })
    const released = new Promise<void>((r) => child.on("exit", () => r()))
    child.on("error", reject)
    child.stdout!.once("data", () => resolve({ child, released }))
  })

const freshFile = () => join(mkdtempSync(join(tmpdir(), "scanfleet-lockwait-")), "fleet.db")

describe("sqlite: waiting for another process's write lock", () => {
  const storeFile = freshFile()
  it.live("a Store transaction refused on the busy lock waits one busy timeout in all, not one for each time the store runs it again", () =>
    Effect.gen(function* () {
      const store = yield* Store.Store
      const lock = yield* Effect.promise(() => holdWriteLock(storeFile, 6000))
      const t0 = Date.now()
      const exit = yield* Effect.exit(store.expireDue({ now: Date.now(), maxAttempts: 3, limit: 10 }))
      const ms = Date.now() - t0
      yield* Effect.promise(() => lock.released)
      expect(Exit.isFailure(exit)).toBe(true)
      if (Exit.isFailure(exit)) expect(JSON.stringify(exit.cause)).toContain("conflict")
      // 1 s of budget and the retries' own backoff (about 80 ms); before, five budgets (5 s).
      expect(ms).toBeLessThan(2000)
      expect(yield* store.expireDue({ now: Date.now(), maxAttempts: 3, limit: 10 })).toEqual([])
    }).pipe(Effect.provide(SqliteStore.layer({ filename: storeFile, busyTimeout: "1 second" }))), 30_000)
})
