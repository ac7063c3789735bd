import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { Config, ConfigProvider, Effect, Redacted } from "effect"
import { inject } from "vitest"
import { PgStore, SqliteStore } from "@scanfleet/adapters"
import { schema, urlFor } from "../support/PgSchema.js"
import { program } from "./Usage.js"

// The code of docs/adapters/sqlite.md and docs/adapters/postgres.md, run as written there.
describe("the adapter pages' example", () => {
  it.live("runs on SQLite", () =>
    Effect.gen(function* () {
      const filename = join(mkdtempSync(join(tmpdir(), "scanfleet-doc-")), "scanfleet.db")
      const out = yield* program.pipe(Effect.provide(SqliteStore.layer({ filename })))
      expect(out).toMatch(/^octo\/hello: clean \(rc-1-1\)$/)
    }))

  it.live("runs on Postgres", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const StoreLive = PgStore.layer({ url: Redacted.make(urlFor(inject("pgUrl"), name)), maxConnections: 4 })
      const out = yield* program.pipe(Effect.provide(StoreLive))
      expect(out).toBe("octo/hello: clean (rc-1-1)")
    }).pipe(Effect.scoped))

  it.live("both stores can read their settings from Config", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const filename = join(mkdtempSync(join(tmpdir(), "scanfleet-doc-")), "scanfleet.db")
      const provider = ConfigProvider.fromMap(new Map([["DATABASE_URL", urlFor(inject("pgUrl"), name)], ["SCANFLEET_DB", filename]]))
      const pgOut = yield* program.pipe(Effect.provide(PgStore.layerConfig({ url: Config.redacted("DATABASE_URL") })), Effect.withConfigProvider(provider))
      const sqliteOut = yield* program.pipe(Effect.provide(SqliteStore.layerConfig({ filename: Config.string("SCANFLEET_DB") })), Effect.withConfigProvider(provider))
      expect([pgOut, sqliteOut]).toEqual(["octo/hello: clean (rc-1-1)", "octo/hello: clean (rc-1-1)"])
      const missing = yield* Effect.flip(program.pipe(Effect.provide(PgStore.layerConfig({ url: Config.redacted("NOT_SET") })), Effect.withConfigProvider(provider)))
      expect(missing).toMatchObject({ _tag: "StoreError", reason: "unavailable" })
    }).pipe(Effect.scoped))

  it.live("a second server on the same database migrates nothing and sees the first one's work", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const settings = { url: Redacted.make(urlFor(inject("pgUrl"), name)) }
      expect(yield* program.pipe(Effect.provide(PgStore.layer(settings)))).toBe("octo/hello: clean (rc-1-1)")
      expect(yield* program.pipe(Effect.provide(PgStore.layer(settings)))).toBe("nothing to do")
    }).pipe(Effect.scoped))
})
