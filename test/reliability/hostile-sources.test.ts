import { NodeHttpClient } from "@effect/platform-node"
import { DiscoveryCycle, DockerHub, GitHub, GitLab, HuggingFace, PgStore, SourceClient, SqliteStore } from "@scanfleet/adapters"
import * as FakeSources from "@scanfleet/adapters/testing/FakeSources"
import { Config, type Discovery, type Source, Store } from "@scanfleet/core"
import { Effect, Layer, ManagedRuntime, Redacted } from "effect"
import fc from "fast-check"
import { randomBytes } from "node:crypto"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest"
import { database, withPg } from "./support/Procs.js"

/**
 * Hostile discovery input through the real source clients, served by the fake
 * APIs on loopback, into real stores (PostgreSQL and a SQLite file): broken
 * and generated pages from every source end the cycle with a recorded error
 * and never crash it; identities with path separators, SQL metacharacters or a
 * megabyte of name are stored exactly or set aside as malformed; timestamps in
 * the year 9999 or before 1970 never promote a target.
 */

const T0 = Date.UTC(2026, 5, 1, 12)
const HOUR = 3_600_000
const DAY = 24 * HOUR
const fast = { timeoutMs: 5_000, retries: 1, backoffMs: 10, maxRateLimitWaitMs: 500, maxRateLimitWaits: 1 } as const
const limits: Discovery.Limits = { maxPages: 20, maxResults: 10_000 }

let fakes: FakeSources.FakeSources
let db: Awaited<ReturnType<typeof database>>
const dir = mkdtempSync(join(tmpdir(), "scanfleet-hostile-"))
const runtimes: Array<ManagedRuntime.ManagedRuntime<Store.Store, unknown>> = []

beforeAll(async () => {
  fakes = await FakeSources.start()
  db = await database(inject("pgUrl"))
}, 240_000)

afterAll(async () => {
  for (const rt of runtimes) await rt.dispose()
  await fakes?.close()
  await db?.drop()
  rmSync(dir, { recursive: true, force: true })
})

let nth = 0
/** A fresh store of each kind: a new schema-less database file for SQLite, a new schema for Postgres. */
const stores: Record<"postgres" | "sqlite", () => Promise<Store.StoreShape>> = {
  postgres: async () => {
    const schema = `hostile_${++nth}`
    await withPg(db.url, (c) => c.query(`CREATE SCHEMA ${schema}`))
    const u = new URL(db.url)
    u.searchParams.set("options", `-c search_path=${schema}`)
    const rt = ManagedRuntime.make(PgStore.layer({ url: Redacted.make(u.toString()), maxConnections: 3 }) as Layer.Layer<Store.Store, unknown>)
    runtimes.push(rt)
    return rt.runPromise(Store.Store)
  },
  sqlite: async () => {
    const rt = ManagedRuntime.make(SqliteStore.layer({ filename: join(dir, `hostile-${++nth}.db`) }) as Layer.Layer<Store.Store, unknown>)
    runtimes.push(rt)
    return rt.runPromise(Store.Store)
  }
}

const client = (source: Source.Source): Promise<SourceClient.SourceClient> => {
  const make =
    source === "github"
      ? GitHub.make({ ...fast, baseUrl: fakes.github.url, listings: [{ kind: "org", org: "acme" }] })
      : source === "gitlab"
        ? GitLab.make({ ...fast, baseUrl: fakes.gitlab.url })
        : source === "huggingface"
          ? HuggingFace.make({ ...fast, baseUrl: fakes.huggingface.url, kinds: ["models"] })
          : DockerHub.make({ ...fast, baseUrl: fakes.dockerhub.url, namespaces: ["acme"] })
  return Effect.runPromise(Effect.provide(make, NodeHttpClient.layer))
}

/** One cycle, with the JSON lines it prints kept out of the test output. */
const cycle = (c: SourceClient.SourceClient, store: Store.StoreShape, now: number, config: Config.ManagedConfig = Config.defaults) =>
  Effect.runPromise(
    Effect.gen(function* () {
      const base = yield* Effect.console
      return yield* DiscoveryCycle.run(c, store, { limits, config }, now).pipe(Effect.withConsole({ ...base, log: () => Effect.void }))
    })
  )

const fill = (source: Source.Source) => {
  for (let i = 0; i < 3; i++) {
    if (source === "github") fakes.github.put(`acme/ok-${i}`, T0 - HOUR)
    if (source === "gitlab") fakes.gitlab.put(`acme/ok-${i}`, T0 - HOUR)
    if (source === "huggingface") fakes.huggingface.put("models", `acme/ok-${i}`, T0 - HOUR)
    if (source === "dockerhub") fakes.dockerhub.tag(`acme/ok-${i}`, "latest", `sha256:${String(i).padStart(64, "0")}`, T0 - HOUR)
  }
}

const sources = ["github", "gitlab", "huggingface", "dockerhub"] as const

describe.each(["postgres", "sqlite"] as const)("hostile sources into %s", (kind) => {
  it.each(sources)("%s: a page cut off mid-JSON, a 500, a dropped connection and a 404 each end the cycle with a recorded error; nothing crashes", async (source) => {
    const store = await stores[kind]()
    fill(source)
    const c = await client(source)
    const faults: Array<FakeSources.Fault> = [{ kind: "malformed_page" }, { kind: "status", status: 500 }, { kind: "status", status: 500 }, { kind: "disconnect" }, { kind: "disconnect" }, { kind: "status", status: 404 }]
    const api = fakes[source]
    for (const [i, f] of [[0, faults[0]], [1, faults[1]], [3, faults[3]], [5, faults[5]]] as const) {
      // Enough copies that the client's retry meets the fault too.
      api.inject(f)
      if (i === 1 || i === 3) api.inject(f)
      const r = await cycle(c, store, T0)
      expect(r.stopReason, `${source} ${f.kind}`).toBe("error")
      expect(r.error).toBeTruthy()
      const recorded = await Effect.runPromise(store.listCycles({ source, limit: 1 }))
      expect(recorded[0]).toMatchObject({ id: r.id, stopReason: "error" })
    }
    // The source recovers and the next cycle lists normally.
    const ok = await cycle(c, store, T0)
    expect(ok.error).toBeNull()
    expect(ok.results).toBeGreaterThanOrEqual(3)
  })

  it.each(sources)("%s: generated pages of any JSON shape never crash a cycle: each is recorded, with an error or with its records counted", async (source) => {
    const store = await stores[kind]()
    const c = await client(source)
    await fc.assert(
      fc.asyncProperty(fc.oneof(fc.unicodeJsonValue({ maxDepth: 5 }), fc.array(fc.dictionary(fc.constantFrom("full_name", "path_with_namespace", "id", "name", "pushed_at", "lastModified", "last_activity_at", "results", "digest", "images", "next"), fc.jsonValue({ maxDepth: 2 })), { maxLength: 5 })), async (body) => {
        fakes[source].inject({ kind: "json", body })
        const r = await cycle(c, store, T0)
        const recorded = await Effect.runPromise(store.listCycles({ source, limit: 1 }))
        expect(recorded[0].id).toBe(r.id)
        expect(r.stopReason === "error" ? r.error !== null : r.error === null).toBe(true)
      }),
      { numRuns: 15 }
    )
  })

  it("hostile identities (path separators, SQL metacharacters, control characters, 1 MB names) are stored exactly or set aside as malformed; the store stays intact", async () => {
    const store = await stores[kind]()
    const hostile = [
      "../../etc/passwd",
      "acme/..\\..\\windows\\system32",
      "acme/x'; DROP TABLE targets; --",
      'acme/robert"); DELETE FROM assignments; --',
      "acme/%00%2e%2e%2f",
      "acme/\u202Eevil\u200B\uFEFF",
      "acme/😀🔥\uD83D",
      "acme/tab\there\nnewline",
      "acme/nul\u0000byte",
      // Random, so no backend can compress it below its index limit.
      `acme/${randomBytes(786_432).toString("base64url")}`
    ]
    for (const id of hostile) fakes.gitlab.put(id, T0 - HOUR)
    const hfHostile = [`acme/${"h".repeat(1 << 20)}`, "acme/'; SELECT pg_sleep(10); --", "acme/\u0000"]
    for (const id of hfHostile) fakes.huggingface.put("models", id, T0 - HOUR)
    for (const [source, c] of [["gitlab", await client("gitlab")], ["huggingface", await client("huggingface")]] as const) {
      const r = await cycle(c, store, T0)
      expect(r.error, `${source}: ${r.error}`).toBeNull()
      const names = source === "gitlab" ? hostile : hfHostile.map((id) => `models/${id}`)
      let stored = 0
      for (const id of names) {
        const t = await Effect.runPromise(Effect.either(store.getTarget(source, id)))
        if (t._tag === "Right") {
          expect(t.right.identity).toBe(id)
          stored++
        }
      }
      // Every hostile record is either a target with exactly its identity, or counted as malformed.
      expect(stored + r.malformed, `${source}: stored ${stored}, malformed ${r.malformed}`).toBeGreaterThanOrEqual(names.length)
    }
    // The tables are all still there and countable.
    const counts = await Effect.runPromise(store.countTargets())
    expect(counts.reduce((n, c) => n + c.count, 0)).toBeGreaterThan(0)
    for (const id of hostile) fakes.gitlab.remove(id)
    for (const id of hfHostile) fakes.huggingface.remove(id)
  })

  it("remote timestamps in the year 9999, before 1970, before 2000 or without an offset never promote a completed target; a valid newer one does", async () => {
    const store = await stores[kind]()
    const names = ["acme/ts-9999", "acme/ts-1969", "acme/ts-1999", "acme/ts-local", "acme/ts-huge", "acme/ts-valid"]
    for (const n of names) fakes.github.put(n, T0 - DAY)
    const config: Config.ManagedConfig = { ...Config.defaults, sources: { ...Config.defaults.sources, github: { ...Config.defaults.sources.github, cooldownSeconds: 0 } } }
    const c = await client("github")
    await cycle(c, store, T0, config)
    const device = await Effect.runPromise(store.addDevice({ name: "hostile", slots: 1, tokenHash: `h-${kind}-${nth}`, now: T0 }))
    for (;;) {
      const a = await Effect.runPromise(store.claim({ deviceId: device.id, slot: 0, now: T0 + 1000, config }))
      if (a === null) break
      await Effect.runPromise(store.submitResult({ deviceId: device.id, reservationId: a.reservationId, fence: a.fence, now: T0 + 2000, outcome: "clean", finalPhase: null, body: "{}" }))
    }
    fakes.github.put("acme/ts-9999", "9999-12-31T23:59:59Z")
    fakes.github.put("acme/ts-1969", "1969-12-31T23:59:59Z")
    fakes.github.put("acme/ts-1999", "1999-12-31T23:59:59+00:00")
    fakes.github.put("acme/ts-local", "2026-06-02T12:00:00")
    fakes.github.put("acme/ts-huge", "+275760-09-13T00:00:00.000Z")
    const later = T0 + 2 * DAY
    const bad = await cycle(c, store, later, config)
    expect(bad.queuedUpdatedCount).toBe(0)
    for (const n of names) {
      const t = await Effect.runPromise(store.getTarget("github", n))
      expect(t.status, n).toBe("completed")
      expect(t.observedRemoteAt, n).toBe(T0 - DAY)
    }
    // The control: a valid newer push is promoted, so the check above could fail.
    fakes.github.put("acme/ts-valid", T0 + DAY)
    const good = await cycle(c, store, later + 1000, config)
    expect(good.queuedUpdatedCount).toBe(1)
    expect((await Effect.runPromise(store.getTarget("github", "acme/ts-valid"))).status).toBe("pending")
    for (const n of names) fakes.github.remove(n)
  })
})
