import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { MemoryStore } from "@scanfleet/core"
import * as DiscoveryCycle from "../../src/DiscoveryCycle.js"
import * as DockerHub from "../../src/sources/DockerHub.js"
import * as GitHub from "../../src/sources/GitHub.js"
import * as HuggingFace from "../../src/sources/HuggingFace.js"
import type { SourceClient } from "../../src/sources/SourceClient.js"
import * as SourceHttp from "../../src/sources/SourceHttp.js"
import * as FakeSources from "../../src/testing/FakeSources.js"
import { client, configWith, cycle, fast, HOUR } from "./fixtures/Harness.js"

// Sources that misbehave the ways real APIs do: a long first listing, a listing that fails, a
// repository deleted between its listing and its tags, names no registry allows, a reset header in
// the wrong unit, a huge body, a next link back to a page already read.

const digest = (n: number) => `sha256:${n.toString(16).padStart(64, "a")}`
const paths = (api: FakeSources.FakeApi) => api.requests.map((q) => new URL(q.url, api.url).pathname)

describe("a discovery cycle against a misbehaving source", () => {
  it.scopedLive("the listings take turns, so a first listing longer than the page budget leaves the others their pages", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      for (let i = 0; i < 20; i++) fakes.huggingface.put("models", `acme/m${i}`, now - i * HOUR)
      fakes.huggingface.put("datasets", "acme/d", now - HOUR)
      fakes.huggingface.put("spaces", "acme/s", now - HOUR)
      const c = yield* client(HuggingFace.make({ ...fast, baseUrl: fakes.huggingface.url, pageSize: 2 }))
      const store = MemoryStore.make()
      const { cycle: r } = yield* cycle(c, store, configWith("huggingface", {}), now, { maxPages: 3, maxResults: 1000 })
      expect(paths(fakes.huggingface)).toEqual(["/api/models", "/api/datasets", "/api/spaces"])
      expect(r).toMatchObject({ pages: 3, results: 4, stopReason: "page_limit", error: null })
      expect((yield* store.getTarget("huggingface", "spaces/acme/s")).status).toBe("pending")
    })
  )

  it.scopedLive("a failing listing ends itself, not the cycle: the next listing is read and the error names the one that failed", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      fakes.github.put("acme/a", now - HOUR)
      fakes.github.put("acme/b", now - 2 * HOUR)
      fakes.github.inject({ kind: "status", status: 404 })
      const c = yield* client(GitHub.make({ ...fast, baseUrl: fakes.github.url, listings: [{ kind: "org", org: "gone" }, { kind: "org", org: "acme" }] }))
      const store = MemoryStore.make()
      const { cycle: r } = yield* cycle(c, store, configWith("github", {}), now)
      expect(paths(fakes.github)).toEqual(["/orgs/gone/repos", "/orgs/acme/repos"])
      expect(r).toMatchObject({ pages: 1, results: 2, queuedNewCount: 2, stopReason: "error" })
      expect(r.error).toMatch(/^org:gone: http_status: HTTP 404/)
      expect(r.error).not.toContain("org:acme")
    })
  )

  it.scopedLive("a DockerHub repository whose tags answer 404 is set aside as malformed, and the rest of the page is read", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      fakes.dockerhub.tag("acme/alpha", "latest", digest(1), now)
      fakes.dockerhub.tag("acme/gone", "latest", digest(2), now - HOUR)
      fakes.dockerhub.tag("acme/zeta", "latest", digest(3), now - 2 * HOUR)
      // The repositories page, alpha's tags, then gone's tags answer 404 (deleted since it was listed).
      fakes.dockerhub.inject({ kind: "status", status: 404 }, { after: 2 })
      const c = yield* client(DockerHub.make({ ...fast, baseUrl: fakes.dockerhub.url, namespaces: ["acme"] }))
      const store = MemoryStore.make()
      const { cycle: r, lines } = yield* cycle(c, store, configWith("dockerhub", {}), now)
      expect(r).toMatchObject({ pages: 1, results: 2, malformed: 1, stopReason: "end_of_listing", error: null })
      expect(lines).toContainEqual(expect.objectContaining({ message: "malformed_record", identity: "acme/gone", reason: expect.stringContaining("HTTP 404") }))
      expect((yield* store.getTarget("dockerhub", `acme/zeta:latest@${digest(3)}`)).status).toBe("pending")
    })
  )

  it.scopedLive("a DockerHub page fetches no more repositories' tags than the cycle has room for", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      for (let i = 0; i < 10; i++) fakes.dockerhub.tag(`acme/r${i}`, "latest", digest(i + 1), now - i * HOUR)
      const c = yield* client(DockerHub.make({ ...fast, baseUrl: fakes.dockerhub.url, namespaces: ["acme"] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("dockerhub", {}), now, { maxPages: 10, maxResults: 2 })
      expect(r).toMatchObject({ results: 2, stopReason: "result_limit", error: null })
      expect(paths(fakes.dockerhub)).toEqual(["/v2/namespaces/acme/repositories", "/v2/namespaces/acme/repositories/r0/tags", "/v2/namespaces/acme/repositories/r1/tags"])
    })
  )

  it.scopedLive("names no registry allows are malformed records, never a failed cycle; an empty tag digest falls back to the image's", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      fakes.dockerhub.tag("acme/api", "latest", digest(1), now)
      for (const [i, name] of ["bad\ud800", "Upper", "a/b", "x y"].entries()) fakes.dockerhub.putRaw(`acme/${name}`, { name, namespace: "acme" }, now - (i + 1) * HOUR)
      fakes.dockerhub.rawTags.set("acme/api", [
        { name: "a:b", digest: digest(4) },
        { name: "c@d", digest: digest(5) },
        { name: "empty-digest", digest: "", images: [{ digest: digest(6) }] }
      ])
      const c = yield* client(DockerHub.make({ ...fast, baseUrl: fakes.dockerhub.url, namespaces: ["acme"] }))
      const store = MemoryStore.make()
      const { cycle: r, lines } = yield* cycle(c, store, configWith("dockerhub", {}), now)
      expect(r).toMatchObject({ results: 2, malformed: 6, error: null })
      expect((yield* store.getTarget("dockerhub", `acme/api:empty-digest@${digest(6)}`)).status).toBe("pending")
      const identities = lines.filter((l) => l.message === "malformed_record").map((l) => l.identity)
      expect(identities).toEqual(expect.arrayContaining(["bad\ud800", "Upper", "a/b", "x y", "acme/api:a:b", "acme/api:c@d"]))
    })
  )

  it.scopedLive("identities with a C1 control, a bidirectional control or white space at an end are set aside", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      const bad = ["acme/x\u0085y", "acme/\u202Egnp.exe", " ", "acme/trailing "]
      for (const [i, name] of bad.entries()) fakes.github.putRaw(name, { full_name: name, pushed_at: new Date(now - i * HOUR).toISOString() }, now - i * HOUR)
      fakes.github.put("acme/fine", now - DAY_MS)
      const c = yield* client(GitHub.make({ ...fast, baseUrl: fakes.github.url, listings: [{ kind: "search", query: "x" }] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("github", {}), now)
      expect(r).toMatchObject({ results: 1, malformed: bad.length, error: null })
    })
  )

  it.scopedLive("a rate-limit reset too far ahead to be epoch seconds is not believed: the next cycle sends its requests", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      fakes.github.put("acme/a", now - HOUR)
      // Milliseconds where seconds belong: taken as seconds, a wait of some 56,000 years.
      fakes.github.remaining = 0
      fakes.github.resetAt = Date.now()
      const c = yield* client(GitHub.make({ ...fast, baseUrl: fakes.github.url, listings: [{ kind: "org", org: "acme" }] }))
      const store = MemoryStore.make()
      expect((yield* cycle(c, store, configWith("github", {}), now)).cycle.error).toBeNull()
      fakes.github.remaining = 4999
      const second = yield* cycle(c, store, configWith("github", {}), now + 1000)
      expect(second.cycle.error).toBeNull()
      expect(fakes.github.requests).toHaveLength(2)
      expect(SourceHttp.resetWaitMs(String(Date.now()), Date.now())).toBeUndefined()
      expect(SourceHttp.resetWaitMs(String(Math.floor(Date.now() / 1000) + 30), Date.now())).toBeGreaterThan(28_000)
    })
  )

  it.scopedLive("a body past maxResponseBytes ends the listing as a malformed page, read no further and not retried", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      for (let i = 0; i < 100; i++) fakes.github.put(`acme/repository-with-a-long-name-${i}`, now - i * HOUR)
      const c = yield* client(GitHub.make({ ...fast, baseUrl: fakes.github.url, maxResponseBytes: 4096, listings: [{ kind: "org", org: "acme" }] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("github", {}), now)
      expect(r).toMatchObject({ pages: 0, results: 0, stopReason: "error" })
      expect(r.error).toContain("larger than the 4096 bytes")
      expect(fakes.github.requests).toHaveLength(1)
    })
  )

  it.scopedLive("settings given as undefined keep their defaults", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      fakes.github.put("acme/a", Date.now() - HOUR)
      const c = yield* client(GitHub.make({ baseUrl: fakes.github.url, timeoutMs: undefined, retries: undefined, pageSize: undefined, listings: [{ kind: "org", org: "acme" }] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("github", {}), Date.now())
      expect(r).toMatchObject({ results: 1, error: null })
      expect(new URL(fakes.github.requests[0].url, fakes.github.url).searchParams.get("per_page")).toBe("100")
    })
  )

  it.scopedLive("DockerHub's token exchange retries a 503, and a bearer refused mid-cycle is exchanged again and the request resent", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      fakes.dockerhub.credentials = { identifier: "me", secret: "dckr_pat_x" }
      fakes.dockerhub.tag("acme/api", "latest", digest(1))
      fakes.dockerhub.inject({ kind: "status", status: 503 })
      // After the two exchanges and the repositories page, the tags request is refused as an expired bearer.
      fakes.dockerhub.inject({ kind: "status", status: 401 }, { after: 3 })
      const c = yield* client(DockerHub.make({ ...fast, baseUrl: fakes.dockerhub.url, namespaces: ["acme"], username: "me", token: "dckr_pat_x" }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("dockerhub", {}), Date.now())
      expect(r).toMatchObject({ results: 1, error: null })
      expect(fakes.dockerhub.requests.map((q) => `${q.method} ${new URL(q.url, fakes.dockerhub.url).pathname}`)).toEqual([
        "POST /v2/auth/token",
        "POST /v2/auth/token",
        "GET /v2/namespaces/acme/repositories",
        "GET /v2/namespaces/acme/repositories/api/tags",
        "POST /v2/auth/token",
        "GET /v2/namespaces/acme/repositories/api/tags"
      ])
    })
  )

  it.effect("a next-page link back to a page already read, or a client that throws, ends that listing with a recorded error", () =>
    Effect.gen(function* () {
      const pagesOf: Record<number, number> = { 0: 0, 1: 0, 2: 0 }
      const looping: SourceClient = {
        source: "gitlab",
        listings: ["loops", "throws", "fine"],
        fetchPage: (listing, cursor) =>
          Effect.sync(() => {
            pagesOf[listing]++
            if (listing === 1) throw new URIError("URI malformed")
            if (listing === 2) return { records: [{ identity: "g/fine", remoteAt: null, rawRemoteAt: null }], malformed: [], next: null, requests: 1 }
            return { records: [{ identity: `g/loop-${cursor ?? "first"}`, remoteAt: null, rawRemoteAt: null }], malformed: [], next: cursor === null ? "p2" : "p2", requests: 1 }
          })
      }
      const { cycle: r } = yield* cycle(looping, MemoryStore.make(), configWith("gitlab", {}), Date.now())
      expect(pagesOf).toEqual({ 0: 2, 1: 1, 2: 1 })
      expect(r).toMatchObject({ results: 3, stopReason: "error" })
      expect(r.error).toContain("loops: malformed_page: the next-page link leads back to a page this cycle already read (p2)")
      expect(r.error).toContain("throws: client_failure: the gitlab client failed: URI malformed")
      expect(r.error!.length).toBeLessThanOrEqual(DiscoveryCycle.maxErrorLength)
    })
  )
})

const DAY_MS = 86_400_000
