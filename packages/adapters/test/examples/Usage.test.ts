import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
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

  it.live("a second server on the same database migrates nothing and sees the first one's work", () =>
    Effect.gen(function* () {
      const name = yield* schema(inject("pgUrl"))
      const settings = { url: Redacted.make(urlFor(inject("pgUrl"), name)) }
      expect(yield* program.pipe(Effect.provide(PgStore.layer(settings)))).toBe("octo/hello: clean (rc-1-1)")
      expect(yield* program.pipe(Effect.provide(PgStore.layer(settings)))).toBe("nothing to do")
    }).pipe(Effect.scoped))
})
