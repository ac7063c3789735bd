import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { MemoryStore } from "@scanfleet/core"
import * as DockerHub from "../../src/sources/DockerHub.js"
import * as GitHub from "../../src/sources/GitHub.js"
import * as GitLab from "../../src/sources/GitLab.js"
import * as HuggingFace from "../../src/sources/HuggingFace.js"
import * as SourceHttp from "../../src/sources/SourceHttp.js"
import * as FakeSources from "../../src/testing/FakeSources.js"
import { client, configWith, cycle, DAY, fast, HOUR, scanAll } from "./fixtures/Harness.js"

const digest = (n: number) => `sha256:${n.toString(16).padStart(64, "a")}`

describe("source HTTP helpers", () => {
  it("reads the next page from a Link header among other relations", () => {
    expect(SourceHttp.nextLink(`<https://api.github.com/x?page=1>; rel="prev", <https://api.github.com/x?page=3>; rel="next", <https://api.github.com/x?page=9>; rel="last"`)).toBe(
      "https://api.github.com/x?page=3"
    )
    expect(SourceHttp.nextLink(`<https://gitlab.com/api/v4/projects?page=1>; rel="first"`)).toBeNull()
    expect(SourceHttp.nextLink(undefined)).toBeNull()
  })

  it("derives rate-limit waits from Retry-After, X-RateLimit-Reset, RateLimit t= and GitHub's secondary-limit message", () => {
    const now = 1_700_000_000_000
    expect(SourceHttp.rateLimitWaitMs(429, { "retry-after": "7" }, "", now)).toBe(7000)
    expect(SourceHttp.rateLimitWaitMs(403, { "x-ratelimit-remaining": "0", "x-ratelimit-reset": String(now / 1000 + 30) }, "", now)).toBe(30_000)
    expect(SourceHttp.rateLimitWaitMs(429, { ratelimit: `"api";r=0;t=12` }, "", now)).toBe(12_000)
    expect(SourceHttp.rateLimitWaitMs(403, {}, `{"message":"You have exceeded a secondary rate limit"}`, now)).toBe(60_000)
    // A plain 403 (no permission) is not a rate limit and must not be waited on.
    expect(SourceHttp.rateLimitWaitMs(403, { "x-ratelimit-remaining": "4000" }, `{"message":"Resource not accessible"}`, now)).toBeUndefined()
    expect(SourceHttp.rateLimitWaitMs(500, { "retry-after": "1" }, "", now)).toBeUndefined()
  })
})

describe("GitHub client", () => {
  it.scopedLive("lists an organisation by pushed_at with Link pages, a bearer token and the API version header", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      for (let i = 0; i < 5; i++) fakes.github.put(`acme/repo-${i}`, now - i * HOUR)
      fakes.github.put(`other/elsewhere`, now)
      fakes.github.requiredToken = "ghp_test"
      const c = yield* client(GitHub.make({ ...fast, baseUrl: fakes.github.url, token: "ghp_test", pageSize: 2, listings: [{ kind: "org", org: "acme" }] }))
      const store = MemoryStore.make()
      const { cycle: r } = yield* cycle(c, store, configWith("github", {}), now)
      expect(r).toMatchObject({ pages: 3, results: 5, queuedNewCount: 5, stopReason: "end_of_listing", error: null })
      const first = new URL(fakes.github.requests[0].url, fakes.github.url)
      expect(first.pathname).toBe("/orgs/acme/repos")
      expect(Object.fromEntries(first.searchParams)).toMatchObject({ sort: "pushed", direction: "desc", per_page: "2" })
      expect(fakes.github.requests[0].headers).toMatchObject({ authorization: "Bearer ghp_test", "x-github-api-version": "2022-11-28", accept: "application/vnd.github+json" })
      expect(fakes.github.requests.every((q) => q.headers.authorization === "Bearer ghp_test")).toBe(true)
      expect((yield* store.getTarget("github", "acme/repo-4")).observedRemoteAt).toBe(new Date(new Date(now - 4 * HOUR).toISOString()).getTime())
    })
  )

  it.scopedLive("searches repositories sorted by updated", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      fakes.github.put("acme/a", now - DAY)
      const c = yield* client(GitHub.make({ ...fast, baseUrl: fakes.github.url, listings: [{ kind: "search", query: "topic:security" }] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("github", {}), now)
      expect(r).toMatchObject({ pages: 1, results: 1 })
      const u = new URL(fakes.github.requests[0].url, fakes.github.url)
      expect(u.pathname).toBe("/search/repositories")
      expect(Object.fromEntries(u.searchParams)).toMatchObject({ q: "topic:security", sort: "updated", order: "desc" })
    })
  )

  it.scopedLive("a refused token ends the cycle with a recorded auth error", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      fakes.github.put("acme/a", Date.now())
      fakes.github.requiredToken = "right"
      const c = yield* client(GitHub.make({ ...fast, baseUrl: fakes.github.url, token: "wrong", listings: [{ kind: "org", org: "acme" }] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("github", {}), Date.now())
      expect(r.stopReason).toBe("error")
      expect(r.error).toMatch(/auth: HTTP 401/)
      expect(fakes.github.requests).toHaveLength(1)
    })
  )

  it.scopedLive("retries 5xx responses and dropped connections with backoff", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      fakes.github.put("acme/a", now - HOUR)
      fakes.github.inject({ kind: "status", status: 502 })
      fakes.github.inject({ kind: "disconnect" }, { after: 0 })
      const c = yield* client(GitHub.make({ ...fast, baseUrl: fakes.github.url, listings: [{ kind: "org", org: "acme" }] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("github", {}), now)
      expect(r).toMatchObject({ results: 1, error: null })
      expect(fakes.github.requests).toHaveLength(3)
    })
  )

  it.scopedLive("a response slower than the timeout is retried, then recorded as a timeout", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      fakes.github.put("acme/a", Date.now())
      fakes.github.delayMs = 400
      const c = yield* client(GitHub.make({ ...fast, timeoutMs: 100, retries: 1, baseUrl: fakes.github.url, listings: [{ kind: "org", org: "acme" }] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("github", {}), Date.now())
      expect(r).toMatchObject({ stopReason: "error", pages: 0 })
      expect(r.error).toMatch(/timeout: no complete response within 100 ms/)
      expect(fakes.github.requests).toHaveLength(2)
    })
  )

  it.scopedLive("gives up after the configured retries and records the error", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      fakes.github.put("acme/a", Date.now())
      for (let i = 0; i < 3; i++) fakes.github.inject({ kind: "status", status: 503 })
      const c = yield* client(GitHub.make({ ...fast, retries: 2, baseUrl: fakes.github.url, listings: [{ kind: "org", org: "acme" }] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("github", {}), Date.now())
      expect(r).toMatchObject({ stopReason: "error", pages: 0 })
      expect(r.error).toMatch(/HTTP 503/)
      expect(fakes.github.requests).toHaveLength(3)
    })
  )

  it.scopedLive("waits out a primary rate limit (X-RateLimit-Remaining 0 until X-RateLimit-Reset) in the middle of a cycle", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      for (let i = 0; i < 4; i++) fakes.github.put(`acme/r${i}`, now - i * HOUR)
      fakes.github.inject({ kind: "rate_limit", style: "primary", waitSeconds: 1 }, { after: 1 })
      const c = yield* client(GitHub.make({ ...fast, pageSize: 2, baseUrl: fakes.github.url, listings: [{ kind: "org", org: "acme" }] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("github", {}), now)
      expect(r).toMatchObject({ pages: 2, results: 4, error: null, stopReason: "end_of_listing" })
      const [, limited, retried] = fakes.github.requests
      expect(retried.url).toBe(limited.url)
      // The reset is whole seconds: the retry came no earlier than the announced reset.
      expect(retried.at).toBeGreaterThanOrEqual(Math.floor(limited.at / 1000) * 1000 + 1000 - 5)
    })
  )

  it.scopedLive("an exhausted quota announced on a successful page makes the next request wait for X-RateLimit-Reset", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      for (let i = 0; i < 3; i++) fakes.github.put(`acme/r${i}`, now - i * HOUR)
      fakes.github.remaining = 0
      fakes.github.resetAt = Math.floor(now / 1000) + 2
      const c = yield* client(GitHub.make({ ...fast, pageSize: 2, baseUrl: fakes.github.url, listings: [{ kind: "org", org: "acme" }] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("github", {}), now)
      expect(r).toMatchObject({ pages: 2, results: 3, error: null })
      expect(fakes.github.requests).toHaveLength(2)
      expect(fakes.github.requests[1].at).toBeGreaterThanOrEqual(fakes.github.resetAt * 1000 - 5)
    })
  )

  it.scopedLive("a rate limit longer than the allowed wait ends the cycle with a recorded error and keeps the pages already read", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      for (let i = 0; i < 4; i++) fakes.github.put(`acme/r${i}`, now - i * HOUR)
      fakes.github.inject({ kind: "rate_limit", style: "secondary", waitSeconds: 600 }, { after: 1 })
      const store = MemoryStore.make()
      const c = yield* client(GitHub.make({ ...fast, pageSize: 2, baseUrl: fakes.github.url, listings: [{ kind: "org", org: "acme" }] }))
      const { cycle: r, summary } = yield* cycle(c, store, configWith("github", {}), now)
      expect(r).toMatchObject({ pages: 1, results: 2, queuedNewCount: 2, stopReason: "error" })
      expect(r.error).toMatch(/rate_limited: .*600 s/)
      expect(summary).toMatchObject({ stop_reason: "error", error: r.error })
      expect(yield* store.listCycles({ source: "github", limit: 1 })).toEqual([r])
    })
  )

  it.scopedLive("a malformed page ends the cycle with a clear recorded error", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      for (let i = 0; i < 4; i++) fakes.github.put(`acme/r${i}`, now - i * HOUR)
      fakes.github.inject({ kind: "malformed_page" }, { after: 1 })
      const c = yield* client(GitHub.make({ ...fast, pageSize: 2, baseUrl: fakes.github.url, listings: [{ kind: "org", org: "acme" }] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("github", {}), now)
      expect(r).toMatchObject({ pages: 1, results: 2, stopReason: "error" })
      expect(r.error).toMatch(/org:acme: malformed_page: the response body is not JSON/)
    })
  )

  it.scopedLive("a page of the wrong shape is a malformed page, not malformed records", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      fakes.github.put("acme/a", Date.now())
      fakes.github.inject({ kind: "json", body: { message: "Server Error" } })
      const c = yield* client(GitHub.make({ ...fast, baseUrl: fakes.github.url, listings: [{ kind: "org", org: "acme" }] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("github", {}), Date.now())
      expect(r).toMatchObject({ pages: 0, malformed: 0, stopReason: "error" })
      expect(r.error).toMatch(/malformed_page: unexpected page shape/)
    })
  )

  it("refuses a next-page link that leaves the configured API origin", () => {
    {
      expect(Effect.runSync(Effect.either(SourceHttp.sameOrigin("github", "https://api.github.com", "https://evil.example/x", "https://api.github.com/y")))._tag).toBe("Left")
      expect(Effect.runSync(SourceHttp.sameOrigin("github", "https://api.github.com", "/orgs/a/repos?page=2", "https://api.github.com/orgs/a/repos"))).toBe(
        "https://api.github.com/orgs/a/repos?page=2"
      )
    }
  })
})

describe("GitLab client", () => {
  it.scopedLive("lists projects by last_activity_at on a self-hosted base URL with PRIVATE-TOKEN and X-Next-Page", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped({ gitlabPrefix: "/gitlab" })
      const now = Date.now()
      for (let i = 0; i < 5; i++) fakes.gitlab.put(`group/p${i}`, now - i * HOUR)
      fakes.gitlab.requiredToken = "glpat-test"
      expect(fakes.gitlab.url).toMatch(/\/gitlab$/)
      const c = yield* client(GitLab.make({ ...fast, baseUrl: fakes.gitlab.url, token: "glpat-test", pageSize: 2, params: { visibility: "public" } }))
      const store = MemoryStore.make()
      const { cycle: r } = yield* cycle(c, store, configWith("gitlab", {}), now)
      expect(r).toMatchObject({ pages: 3, results: 5, queuedNewCount: 5, error: null })
      const u = new URL(fakes.gitlab.requests[0].url, fakes.gitlab.url)
      expect(u.pathname).toBe("/gitlab/api/v4/projects")
      expect(Object.fromEntries(u.searchParams)).toMatchObject({ order_by: "last_activity_at", sort: "desc", per_page: "2", visibility: "public" })
      expect(fakes.gitlab.requests.every((q) => q.headers["private-token"] === "glpat-test")).toBe(true)
      expect((yield* store.getTarget("gitlab", "group/p3")).observedRemoteAt).toBe(Date.parse(new Date(now - 3 * HOUR).toISOString()))
    })
  )

  it.scopedLive("follows X-Next-Page when no Link header is sent", () =>
    Effect.gen(function* () {
      // A GitLab behind a proxy that strips Link: the page number header still pages.
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      for (let i = 0; i < 3; i++) fakes.gitlab.put(`g/p${i}`, now - i * HOUR)
      const stripped = new (class extends FakeSources.FakeGitLab {
        protected override route(req: Parameters<FakeSources.FakeGitLab["route"]>[0], url: URL): FakeSources.Reply | null {
          const r = super.route(req, url)
          if (r === null) return r
          const { link: _drop, ...headers } = r.headers ?? {}
          return { ...r, headers }
        }
      })()
      for (let i = 0; i < 3; i++) stripped.put(`g/p${i}`, now - i * HOUR)
      yield* Effect.acquireRelease(Effect.promise(() => stripped.start()), (s) => Effect.promise(() => s.close()))
      const c = yield* client(GitLab.make({ ...fast, baseUrl: stripped.url, pageSize: 2 }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("gitlab", {}), now)
      expect(r).toMatchObject({ pages: 2, results: 3, error: null })
      expect(new URL(stripped.requests[1].url, stripped.url).searchParams.get("page")).toBe("2")
    })
  )

  it.scopedLive("waits out a 429 with Retry-After and RateLimit-Reset", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      for (let i = 0; i < 3; i++) fakes.gitlab.put(`g/p${i}`, now - i * HOUR)
      fakes.gitlab.inject({ kind: "rate_limit", style: "429", waitSeconds: 1 }, { after: 1 })
      const c = yield* client(GitLab.make({ ...fast, baseUrl: fakes.gitlab.url, pageSize: 2 }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("gitlab", {}), now)
      expect(r).toMatchObject({ pages: 2, results: 3, error: null })
      expect(fakes.gitlab.requests[2].at - fakes.gitlab.requests[1].at).toBeGreaterThanOrEqual(900)
    })
  )
})

describe("HuggingFace client", () => {
  it.scopedLive("lists models, datasets and spaces by lastModified descending with cursor pages and a bearer token", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      for (let i = 0; i < 3; i++) fakes.huggingface.put("models", `acme/m${i}`, now - i * HOUR)
      fakes.huggingface.put("datasets", "acme/d", now - DAY)
      fakes.huggingface.put("spaces", "acme/demo", now - 2 * DAY)
      const c = yield* client(HuggingFace.make({ ...fast, baseUrl: fakes.huggingface.url, token: "hf_test", pageSize: 2 }))
      const store = MemoryStore.make()
      const { cycle: r } = yield* cycle(c, store, configWith("huggingface", {}), now)
      expect(r).toMatchObject({ pages: 4, results: 5, queuedNewCount: 5, error: null })
      const paths = fakes.huggingface.requests.map((q) => new URL(q.url, fakes.huggingface.url))
      // The listings take turns: the first page of each, then the second page of models.
      expect(paths.map((u) => u.pathname)).toEqual(["/api/models", "/api/datasets", "/api/spaces", "/api/models"])
      expect(paths[0].searchParams.get("sort")).toBe("lastModified")
      expect(paths[0].searchParams.get("direction")).toBe("-1")
      expect(paths[0].searchParams.getAll("expand[]")).toContain("lastModified")
      expect(paths[3].searchParams.get("cursor")).toBeTruthy()
      expect(fakes.huggingface.requests.every((q) => q.headers.authorization === "Bearer hf_test")).toBe(true)
      expect((yield* store.getTarget("huggingface", "spaces/acme/demo")).observedRemoteAt).toBe(Date.parse(new Date(now - 2 * DAY).toISOString()))
    })
  )

  it.scopedLive("waits out a 429 announced by the RateLimit header", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      fakes.huggingface.put("spaces", "acme/a", now - HOUR)
      fakes.huggingface.inject({ kind: "rate_limit", style: "429", waitSeconds: 1 })
      const c = yield* client(HuggingFace.make({ ...fast, baseUrl: fakes.huggingface.url, kinds: ["spaces"] }))
      const { cycle: r } = yield* cycle(c, MemoryStore.make(), configWith("huggingface", {}), now)
      expect(r).toMatchObject({ results: 1, error: null })
      expect(fakes.huggingface.requests[1].at - fakes.huggingface.requests[0].at).toBeGreaterThanOrEqual(900)
    })
  )
})

describe("DockerHub client", () => {
  it.scopedLive("lists repositories then tags, exchanging a personal access token for a bearer", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      fakes.dockerhub.credentials = { identifier: "me", secret: "dckr_pat_x" }
      const now = Date.now()
      fakes.dockerhub.tag("acme/api", "latest", digest(1), now)
      fakes.dockerhub.tag("acme/api", "1.0", digest(2), now - HOUR)
      fakes.dockerhub.tag("acme/web", "latest", digest(3), now - 2 * HOUR)
      const c = yield* client(DockerHub.make({ ...fast, baseUrl: fakes.dockerhub.url, namespaces: ["acme"], username: "me", token: "dckr_pat_x", pageSize: 1 }))
      const store = MemoryStore.make()
      const { cycle: r } = yield* cycle(c, store, configWith("dockerhub", {}), Date.now())
      expect(r).toMatchObject({ pages: 2, results: 3, queuedNewCount: 3, error: null })
      const [login, ...rest] = fakes.dockerhub.requests
      expect(login).toMatchObject({ method: "POST", url: "/v2/auth/token" })
      expect(rest.map((q) => new URL(q.url, fakes.dockerhub.url).pathname)).toEqual([
        "/v2/namespaces/acme/repositories",
        "/v2/namespaces/acme/repositories/api/tags",
        "/v2/namespaces/acme/repositories",
        "/v2/namespaces/acme/repositories/web/tags"
      ])
      expect(rest.every((q) => q.headers.authorization === "Bearer jwt-1")).toBe(true)
      expect((yield* store.getTarget("dockerhub", `acme/api:1.0@${digest(2)}`)).observedRemoteAt).toBeNull()
    })
  )

  it.scopedLive("a namespace is listed most recently updated first, so a cycle with a budget of one page finds a push to a repository created long before", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const now = Date.now()
      // Created (and first pushed) a, b, c, d, e, oldest first.
      for (const [i, name] of ["a", "b", "c", "d", "e"].entries()) fakes.dockerhub.tag(`acme/${name}`, "latest", digest(i + 1), now - (10 - i) * HOUR)
      const c = yield* client(DockerHub.make({ ...fast, baseUrl: fakes.dockerhub.url, namespaces: ["acme"], pageSize: 2 }))
      const store = MemoryStore.make()
      const onePage = { maxPages: 1, maxResults: 1000 }
      const first = yield* cycle(c, store, configWith("dockerhub", {}), now, onePage)
      expect(first.cycle).toMatchObject({ pages: 1, results: 2, queuedNewCount: 2, stopReason: "page_limit" })
      expect(yield* store.getTarget("dockerhub", `acme/e:latest@${digest(5)}`)).toMatchObject({ status: "pending" })
      // A new digest pushed to the first repository ever created: the next cycle's one page has it.
      fakes.dockerhub.tag("acme/a", "latest", digest(9), now)
      const second = yield* cycle(c, store, configWith("dockerhub", {}), now, onePage)
      expect(second.cycle).toMatchObject({ pages: 1, queuedNewCount: 1 })
      expect(yield* store.getTarget("dockerhub", `acme/a:latest@${digest(9)}`)).toMatchObject({ status: "pending" })
      const listings = fakes.dockerhub.requests.map((q) => new URL(q.url, fakes.dockerhub.url)).filter((u) => u.pathname === "/v2/namespaces/acme/repositories")
      expect(listings.map((u) => u.searchParams.get("ordering"))).toEqual(["-last_updated", "-last_updated"])
      // The fake refuses an ordering Docker Hub does not offer, as a stand-in should.
      const refused = yield* Effect.promise(() => fetch(`${fakes.dockerhub.url}/v2/namespaces/acme/repositories?ordering=stars`))
      expect(refused.status).toBe(400)
    })
  )

  it.scopedLive("a tag without a sha256 digest is a malformed record, logged with its identity and skipped", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      fakes.dockerhub.tag("acme/api", "latest", digest(1))
      fakes.dockerhub.rawTags.set("acme/api", [{ name: "broken", digest: null, images: [] }])
      const c = yield* client(DockerHub.make({ ...fast, baseUrl: fakes.dockerhub.url, namespaces: ["acme"] }))
      const { cycle: r, lines } = yield* cycle(c, MemoryStore.make(), configWith("dockerhub", {}), Date.now())
      expect(r).toMatchObject({ results: 1, malformed: 1, error: null })
      expect(lines).toContainEqual(expect.objectContaining({ message: "malformed_record", level: "warning", source: "dockerhub", identity: "acme/api:broken" }))
    })
  )
})

describe("fake source catalogues for demos", () => {
  it.scopedLive("seed fills every source and churn makes changed targets that the next cycles promote", () =>
    Effect.gen(function* () {
      const fakes = yield* FakeSources.scoped()
      const t0 = Date.UTC(2026, 5, 1)
      FakeSources.seed(fakes, t0, 8)
      const clients = [
        yield* client(GitHub.make({ ...fast, baseUrl: fakes.github.url, pageSize: 3, listings: [{ kind: "org", org: "demo-org" }] })),
        yield* client(GitLab.make({ ...fast, baseUrl: fakes.gitlab.url, pageSize: 3 })),
        yield* client(HuggingFace.make({ ...fast, baseUrl: fakes.huggingface.url, pageSize: 3 })),
        yield* client(DockerHub.make({ ...fast, baseUrl: fakes.dockerhub.url, namespaces: ["demo"], pageSize: 3 }))
      ]
      const store = MemoryStore.make()
      for (const c of clients) expect((yield* cycle(c, store, configWith(c.source, {}), t0)).cycle).toMatchObject({ queuedNewCount: 8, malformed: 0, error: null })
      yield* scanAll(store, t0)
      let n = 0
      const touched = FakeSources.churn(fakes, t0 + HOUR, 2, () => [0.1, 0.6][n++ % 2])
      expect(touched).toHaveLength(8)
      const later = t0 + 2 * DAY
      const updated = []
      for (const c of clients) updated.push((yield* cycle(c, store, configWith(c.source, {}), later)).cycle)
      expect(updated.map((u) => u.queuedUpdatedCount)).toEqual([2, 2, 2, 0])
      // DockerHub: the moved tag is a new identity (once per distinct repository touched).
      expect(updated[3].queuedNewCount).toBe(2)
    })
  )
})
