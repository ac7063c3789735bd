import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { Effect, type Scope } from "effect"

/**
 * Local stand-ins for the GitHub, GitLab, HuggingFace and DockerHub listing
 * APIs: real HTTP servers on 127.0.0.1 that serve pages with the real field
 * names, pagination headers and rate-limit responses, from an in-memory
 * catalogue a test or a demo changes while discovery runs.
 */

/** A response to serve instead of the next page. */
export type Fault =
  /** `primary`: GitHub's exhausted quota (403, X-RateLimit-Remaining 0, reset); `secondary`: 403 with Retry-After; `429`: 429 with the API's own headers. */
  | { readonly kind: "rate_limit"; readonly style: "primary" | "secondary" | "429"; readonly waitSeconds: number }
  | { readonly kind: "status"; readonly status: number }
  /** A 200 whose body is cut off mid-JSON. */
  | { readonly kind: "malformed_page" }
  /** A 200 with this JSON body, whatever its shape. */
  | { readonly kind: "json"; readonly body: unknown }
  /** Closes the connection without a response. */
  | { readonly kind: "disconnect" }

/** What a route answers. */
export interface Reply {
  readonly status?: number
  readonly headers?: Record<string, string>
  readonly body: unknown
}

/** One request the fake received. */
export interface LoggedRequest {
  readonly method: string
  readonly url: string
  readonly headers: Readonly<Record<string, string | Array<string> | undefined>>
  readonly at: number
}

/** One catalogue entry: the record exactly as the API returns it, and its position in "recently updated first" order. */
export interface Entry {
  readonly key: string
  readonly record: Record<string, unknown>
  readonly sortAt: number
}

const iso = (t: number | string | null): string | null => (typeof t === "number" ? new Date(t).toISOString() : t)
const sortKey = (t: number | string | null): number => {
  if (typeof t === "number") return t
  const p = t === null ? NaN : Date.parse(t)
  return Number.isFinite(p) ? p : 0
}

/** What all four fakes share: the server, the request log, injected faults, the catalogue. */
export class FakeApi {
  /** The base URL a client is configured with. */
  url = ""
  readonly requests: Array<LoggedRequest> = []
  /** Delay before every response, milliseconds (to make cycles overlap in tests). */
  delayMs = 0
  /** When set, requests without this credential are answered 401. */
  requiredToken: string | null = null
  protected readonly entries = new Map<string, Entry>()
  private readonly faults: Array<{ skip: number; fault: Fault }> = []
  private server: Server | null = null
  private inFlight = 0
  /** The most requests this fake ever served at once. */
  maxConcurrent = 0

  constructor(readonly name: string, readonly prefix = "") {}

  /** Serves `fault` instead of a normal response, after letting `after` further requests through. */
  inject(fault: Fault, options: { readonly after?: number } = {}): void {
    this.faults.push({ skip: options.after ?? 0, fault })
  }

  /** Adds or replaces a raw catalogue record (use it for malformed records). */
  putRaw(key: string, record: Record<string, unknown>, sortAt: number): void {
    this.entries.set(key, { key, record, sortAt })
  }

  /** Removes a record. */
  remove(key: string): void {
    this.entries.delete(key)
  }

  /** The catalogue, most recently updated first. */
  list(filter: (e: Entry) => boolean = () => true): Array<Entry> {
    return [...this.entries.values()].filter(filter).sort((a, b) => b.sortAt - a.sortAt || a.key.localeCompare(b.key))
  }

  /** Starts listening on an ephemeral loopback port. */
  async start(): Promise<this> {
    const server = createServer((req, res) => void this.handle(req, res))
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
    this.server = server
    this.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}${this.prefix}`
    return this
  }

  /** Stops the server and drops open connections. */
  async close(): Promise<void> {
    const s = this.server
    if (!s) return
    this.server = null
    s.closeAllConnections()
    await new Promise<void>((resolve) => s.close(() => resolve()))
  }

  protected takeFault(): Fault | undefined {
    const i = this.faults.findIndex((f) => f.skip === 0)
    for (const f of this.faults) if (f.skip > 0) f.skip--
    return i === -1 ? undefined : this.faults.splice(i, 1)[0].fault
  }

  /** Headers every response of this API carries (rate-limit counters). */
  protected baseHeaders(): Record<string, string> {
    return {}
  }

  /** The rate-limit response in this API's own words. */
  protected rateLimited(f: Extract<Fault, { kind: "rate_limit" }>): Reply {
    return { status: 429, headers: { "retry-after": String(f.waitSeconds) }, body: { message: "Too Many Requests" } }
  }

  protected authorized(_req: IncomingMessage): boolean {
    return true
  }

  /** Answers one request; `null` means 404. */
  protected route(_req: IncomingMessage, _url: URL, _body: string): Reply | null {
    return null
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    this.inFlight++
    this.maxConcurrent = Math.max(this.maxConcurrent, this.inFlight)
    try {
      const chunks: Array<Buffer> = []
      for await (const c of req) chunks.push(c as Buffer)
      this.requests.push({ method: req.method ?? "GET", url: req.url ?? "/", headers: { ...req.headers }, at: Date.now() })
      if (this.delayMs > 0) await new Promise((r) => setTimeout(r, this.delayMs))
      const send = (status: number, headers: Record<string, string>, body: string) => {
        res.writeHead(status, { "content-type": "application/json; charset=utf-8", ...this.baseHeaders(), ...headers })
        res.end(body)
      }
      const fault = this.takeFault()
      if (fault) {
        switch (fault.kind) {
          case "disconnect":
            req.socket.destroy()
            return
          case "malformed_page":
            return send(200, {}, `[{"id": 1, "name": "trunc`)
          case "json":
            return send(200, {}, JSON.stringify(fault.body))
          case "status":
            return send(fault.status, {}, JSON.stringify({ message: `fake ${this.name} error ${fault.status}` }))
          case "rate_limit": {
            const r = this.rateLimited(fault)
            return send(r.status ?? 429, r.headers ?? {}, typeof r.body === "string" ? r.body : JSON.stringify(r.body))
          }
        }
      }
      if (!this.authorized(req)) return send(401, {}, JSON.stringify({ message: "Bad credentials" }))
      const url = new URL(req.url ?? "/", `http://${req.headers.host ?? "127.0.0.1"}`)
      if (this.prefix && !url.pathname.startsWith(this.prefix)) return send(404, {}, JSON.stringify({ message: "Not Found" }))
      const out = this.route(req, url, Buffer.concat(chunks).toString("utf8"))
      if (out === null) return send(404, {}, JSON.stringify({ message: "Not Found" }))
      send(out.status ?? 200, out.headers ?? {}, JSON.stringify(out.body))
    } finally {
      this.inFlight--
    }
  }

  /** The absolute URL of a path on this server, for pagination links. */
  protected self(url: URL, params: Record<string, string>): string {
    const u = new URL(url.toString())
    for (const [k, v] of Object.entries(params)) u.searchParams.set(k, v)
    return u.toString()
  }
}

const intParam = (url: URL, name: string, fallback: number, max: number) => {
  const n = Number(url.searchParams.get(name))
  return Number.isInteger(n) && n > 0 ? Math.min(n, max) : fallback
}

const linkHeader = (links: ReadonlyArray<readonly [string, string]>) => links.map(([rel, href]) => `<${href}>; rel="${rel}"`).join(", ")

/** GitHub: `/search/repositories`, `/orgs/{org}/repos`, `/users/{user}/repos`, with Link pagination and X-RateLimit-* headers. */
export class FakeGitHub extends FakeApi {
  private nextId = 1
  /** Quota announced on every response; at 0 the fake still serves (inject a fault to refuse). */
  remaining = 4999
  resetAt = Math.floor(Date.now() / 1000) + 3600

  constructor() {
    super("github")
  }

  /**
   * Adds or replaces a repository `owner/name` with its `pushed_at` (epoch ms,
   * raw text for malformed values, or null) and `updated_at` (metadata changes
   * such as stars move it too; search `sort=updated` orders by it).
   */
  put(fullName: string, pushedAt: number | string | null, updatedAt: number | string | null = pushedAt): void {
    const [owner, name] = fullName.split("/")
    const prior = this.entries.get(fullName)?.record
    const id = (prior?.id as number | undefined) ?? this.nextId++
    const at = iso(pushedAt)
    this.putRaw(
      fullName,
      {
        id,
        node_id: `R_${id}`,
        name,
        full_name: fullName,
        private: false,
        owner: { login: owner, type: "Organization" },
        html_url: `https://github.com/${fullName}`,
        created_at: "2015-01-01T00:00:00Z",
        updated_at: iso(updatedAt),
        pushed_at: at
      },
      sortKey(pushedAt)
    )
  }

  /** Pushes to a repository again: a newer `pushed_at`. */
  push(fullName: string, at: number): void {
    this.put(fullName, at)
  }

  protected override baseHeaders(): Record<string, string> {
    return {
      "x-ratelimit-limit": "5000",
      "x-ratelimit-remaining": String(this.remaining),
      "x-ratelimit-reset": String(this.resetAt),
      "x-ratelimit-used": String(5000 - this.remaining),
      "x-ratelimit-resource": "core",
      "x-github-media-type": "github.v3; format=json"
    }
  }

  protected override rateLimited(f: Extract<Fault, { kind: "rate_limit" }>): Reply {
    const doc = "https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api"
    const reset = String(Math.floor(Date.now() / 1000) + f.waitSeconds)
    switch (f.style) {
      case "primary":
        return {
          status: 403,
          headers: { "x-ratelimit-remaining": "0", "x-ratelimit-reset": reset, "x-ratelimit-used": "5000" },
          body: { message: "API rate limit exceeded for user ID 1.", documentation_url: doc }
        }
      case "secondary":
        return {
          status: 403,
          headers: { "retry-after": String(f.waitSeconds) },
          body: { message: "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.", documentation_url: doc }
        }
      case "429":
        return { status: 429, headers: { "retry-after": String(f.waitSeconds) }, body: { message: "You have exceeded a secondary rate limit.", documentation_url: doc } }
    }
  }

  protected override authorized(req: IncomingMessage): boolean {
    return this.requiredToken === null || req.headers.authorization === `Bearer ${this.requiredToken}`
  }

  protected override route(_req: IncomingMessage, url: URL): Reply | null {
    const page = intParam(url, "page", 1, 1_000_000)
    const perPage = intParam(url, "per_page", 30, 100)
    let items: Array<Entry>
    const m = /^\/(orgs|users)\/([^/]+)\/repos$/.exec(url.pathname)
    if (url.pathname === "/search/repositories")
      items = this.list().sort((a, b) => sortKey(b.record.updated_at as string | null) - sortKey(a.record.updated_at as string | null) || a.key.localeCompare(b.key))
    else if (m) items = this.list((e) => e.key.split("/")[0] === decodeURIComponent(m[2]))
    else return null
    const slice = items.slice((page - 1) * perPage, page * perPage).map((e) => e.record)
    const last = Math.max(1, Math.ceil(items.length / perPage))
    const links: Array<readonly [string, string]> = []
    if (page < last) links.push(["next", this.self(url, { page: String(page + 1) })], ["last", this.self(url, { page: String(last) })])
    if (page > 1) links.push(["prev", this.self(url, { page: String(page - 1) })], ["first", this.self(url, { page: "1" })])
    const headers: Record<string, string> = links.length > 0 ? { link: linkHeader(links) } : {}
    const body = url.pathname === "/search/repositories" ? { total_count: items.length, incomplete_results: false, items: slice } : slice
    return { headers, body }
  }
}

/** GitLab: `{prefix}/api/v4/projects` ordered by `last_activity_at`, with X-Page/X-Next-Page/X-Total and Link headers. */
export class FakeGitLab extends FakeApi {
  private nextId = 1

  /** `prefix` mounts the API under a path, as a self-hosted instance at `https://host/gitlab` does. */
  constructor(prefix = "") {
    super("gitlab", prefix)
  }

  /** Adds or replaces a project `group/name` with its `last_activity_at`. */
  put(path: string, lastActivityAt: number | string | null): void {
    const prior = this.entries.get(path)?.record
    const id = (prior?.id as number | undefined) ?? this.nextId++
    const name = path.split("/").pop()!
    this.putRaw(
      path,
      {
        id,
        name,
        path: name,
        path_with_namespace: path,
        name_with_namespace: path.replace(/\//g, " / "),
        web_url: `https://gitlab.example/${path}`,
        created_at: "2016-01-01T00:00:00.000Z",
        last_activity_at: iso(lastActivityAt)
      },
      sortKey(lastActivityAt)
    )
  }

  /** New activity on a project. */
  touch(path: string, at: number): void {
    this.put(path, at)
  }

  protected override rateLimited(f: Extract<Fault, { kind: "rate_limit" }>): Reply {
    const reset = Math.floor(Date.now() / 1000) + f.waitSeconds
    return {
      status: 429,
      headers: {
        "retry-after": String(f.waitSeconds),
        "ratelimit-limit": "2000",
        "ratelimit-observed": "2001",
        "ratelimit-remaining": "0",
        "ratelimit-reset": String(reset),
        "ratelimit-resettime": new Date(reset * 1000).toUTCString()
      },
      body: "Retry later\n"
    }
  }

  protected override authorized(req: IncomingMessage): boolean {
    return this.requiredToken === null || req.headers["private-token"] === this.requiredToken
  }

  protected override route(_req: IncomingMessage, url: URL): Reply | null {
    if (url.pathname !== `${this.prefix}/api/v4/projects`) return null
    const page = intParam(url, "page", 1, 1_000_000)
    const perPage = intParam(url, "per_page", 20, 100)
    const items = this.list()
    const totalPages = Math.max(1, Math.ceil(items.length / perPage))
    const next = page < totalPages ? String(page + 1) : ""
    const links: Array<readonly [string, string]> = []
    if (next) links.push(["next", this.self(url, { page: next })])
    links.push(["first", this.self(url, { page: "1" })], ["last", this.self(url, { page: String(totalPages) })])
    return {
      headers: {
        "x-page": String(page),
        "x-per-page": String(perPage),
        "x-next-page": next,
        "x-prev-page": page > 1 ? String(page - 1) : "",
        "x-total": String(items.length),
        "x-total-pages": String(totalPages),
        link: linkHeader(links)
      },
      body: items.slice((page - 1) * perPage, page * perPage).map((e) => e.record)
    }
  }
}

/** HuggingFace: `/api/models|datasets|spaces?sort=lastModified&direction=-1`, cursor pages in the Link header. */
export class FakeHuggingFace extends FakeApi {
  constructor() {
    super("huggingface")
  }

  /** Adds or replaces a repository of a kind (`spaces`, `acme/demo`) with its creation and last modification times. */
  put(kind: "models" | "datasets" | "spaces", id: string, lastModified: number | string | null, createdAt: number = Date.UTC(2021, 0, 1)): void {
    const key = `${kind}/${id}`
    this.putRaw(key, { _id: Buffer.from(key).toString("hex").slice(0, 24), id, createdAt: new Date(createdAt).toISOString(), lastModified: iso(lastModified) }, sortKey(lastModified))
    this.created.set(key, createdAt)
  }

  private readonly created = new Map<string, number>()

  protected override rateLimited(f: Extract<Fault, { kind: "rate_limit" }>): Reply {
    return {
      status: 429,
      headers: { ratelimit: `"api";r=0;t=${f.waitSeconds}`, "ratelimit-policy": `"fixed window";"api";q=1000;w=300` },
      body: { error: "You have exceeded our hourly quotas for action: api. We invite you to retry later." }
    }
  }

  protected override authorized(req: IncomingMessage): boolean {
    return this.requiredToken === null || req.headers.authorization === `Bearer ${this.requiredToken}`
  }

  protected override route(_req: IncomingMessage, url: URL): Reply | null {
    const m = /^\/api\/(models|datasets|spaces)$/.exec(url.pathname)
    if (!m) return null
    const kind = m[1]
    const limit = intParam(url, "limit", 1000, 1000)
    const byModified = url.searchParams.get("sort") === "lastModified"
    const entries = this.list((e) => e.key.startsWith(`${kind}/`))
    // Without sort=lastModified the Hub lists oldest-created first: a long-lived, recently updated Space sits at the back.
    if (!byModified) entries.sort((a, b) => (this.created.get(a.key) ?? 0) - (this.created.get(b.key) ?? 0) || a.key.localeCompare(b.key))
    const cursor = url.searchParams.get("cursor")
    const offset = cursor ? Number(Buffer.from(cursor, "base64url").toString("utf8").replace(/^offset:/, "")) || 0 : 0
    const slice = entries.slice(offset, offset + limit).map((e) => e.record)
    const headers: Record<string, string> = {}
    if (offset + limit < entries.length)
      headers.link = linkHeader([["next", this.self(url, { cursor: Buffer.from(`offset:${offset + limit}`).toString("base64url") })]])
    return { headers, body: slice }
  }
}

/**
 * DockerHub: `/v2/namespaces/{ns}/repositories` (in `ordering`: `name`, `last_updated` or `pull_count`, `-` for
 * descending; without it, in the order the repositories were created, since the API documents no default),
 * `…/{repo}/tags` (page/page_size, `next` URLs) and `POST /v2/auth/token`.
 */
export class FakeDockerHub extends FakeApi {
  /** When set, `POST /v2/auth/token` accepts this identifier and secret and hands out a bearer. */
  credentials: { readonly identifier: string; readonly secret: string } | null = null
  private readonly issued = new Set<string>()
  private readonly tags = new Map<string, Map<string, { digest: string; at: number }>>()

  constructor() {
    super("dockerhub")
  }

  /** Adds or re-points a tag `ns/repo:tag` to a digest (a new digest is a new push, which updates its repository). */
  tag(repository: string, tag: string, digest: string, at: number = Date.now()): void {
    const [ns, name] = repository.split("/")
    const known = this.entries.get(repository)
    if (known === undefined || at > known.sortAt)
      this.putRaw(
        repository,
        { name, namespace: ns, repository_type: "image", status: 1, is_private: false, star_count: 0, pull_count: 0, ...known?.record, last_updated: new Date(at).toISOString() },
        at
      )
    const t = this.tags.get(repository) ?? new Map()
    t.set(tag, { digest, at })
    this.tags.set(repository, t)
  }

  /** A raw tag record (for malformed tags). */
  rawTags = new Map<string, Array<Record<string, unknown>>>()

  protected override baseHeaders(): Record<string, string> {
    return { "x-ratelimit-limit": "180", "x-ratelimit-remaining": "179", "x-ratelimit-reset": String(Math.floor(Date.now() / 1000) + 60) }
  }

  protected override rateLimited(f: Extract<Fault, { kind: "rate_limit" }>): Reply {
    return {
      status: 429,
      headers: { "retry-after": String(f.waitSeconds), "x-ratelimit-remaining": "0", "x-ratelimit-reset": String(Math.floor(Date.now() / 1000) + f.waitSeconds) },
      body: { message: "Too Many Requests" }
    }
  }

  protected override authorized(req: IncomingMessage): boolean {
    if (this.credentials === null && this.requiredToken === null) return true
    if (req.method === "POST" && req.url?.startsWith("/v2/auth/token")) return true
    const h = req.headers.authorization ?? ""
    return h === `Bearer ${this.requiredToken}` || this.issued.has(h.replace(/^Bearer /, ""))
  }

  private paged(url: URL, all: Array<unknown>) {
    const page = intParam(url, "page", 1, 1_000_000)
    const size = intParam(url, "page_size", 10, 100)
    const results = all.slice((page - 1) * size, page * size)
    return {
      count: all.length,
      next: page * size < all.length ? this.self(url, { page: String(page + 1), page_size: String(size) }) : null,
      previous: page > 1 ? this.self(url, { page: String(page - 1), page_size: String(size) }) : null,
      results
    }
  }

  protected override route(req: IncomingMessage, url: URL, body: string): Reply | null {
    if (req.method === "POST" && url.pathname === "/v2/auth/token") {
      let b: { identifier?: unknown; secret?: unknown } = {}
      try {
        b = JSON.parse(body)
      } catch {
        return { status: 400, body: { message: "invalid body" } }
      }
      if (!this.credentials || b.identifier !== this.credentials.identifier || b.secret !== this.credentials.secret)
        return { status: 401, body: { message: "incorrect username or password" } }
      const token = `jwt-${this.issued.size + 1}`
      this.issued.add(token)
      return { body: { access_token: token } }
    }
    const repos = /^\/v2\/namespaces\/([^/]+)\/repositories$/.exec(url.pathname)
    if (repos) {
      const ordering = url.searchParams.get("ordering")
      const listed = [...this.entries.values()].filter((e) => e.key.split("/")[0] === repos[1])
      if (ordering === null) return { body: this.paged(url, listed.map((e) => e.record)) }
      const field = ordering.replace(/^-/, "")
      const keyOf: ((e: Entry) => string | number) | undefined = { name: (e: Entry) => e.key, last_updated: (e: Entry) => e.sortAt, pull_count: (e: Entry) => Number(e.record.pull_count ?? 0) }[field]
      if (keyOf === undefined) return { status: 400, body: { message: `ordering: "${ordering}" is not one of name, last_updated, pull_count (with "-" for descending)` } }
      const sign = ordering.startsWith("-") ? -1 : 1
      const sorted = listed.sort((a, b) => {
        const [x, y] = [keyOf(a), keyOf(b)]
        return (x < y ? -sign : x > y ? sign : 0) || a.key.localeCompare(b.key)
      })
      return { body: this.paged(url, sorted.map((e) => e.record)) }
    }
    const tags = /^\/v2\/namespaces\/([^/]+)\/repositories\/([^/]+)\/tags$/.exec(url.pathname)
    if (tags) {
      const repo = `${tags[1]}/${tags[2]}`
      if (!this.entries.has(repo)) return null
      const list = [...(this.tags.get(repo) ?? new Map()).entries()]
        .sort((a, b) => b[1].at - a[1].at || a[0].localeCompare(b[0]))
        .map(([name, t]) => ({
          creator: 1,
          id: 1,
          images: [{ architecture: "amd64", os: "linux", digest: t.digest.replace(/.$/, "0"), size: 1000, status: "active" }],
          last_updated: new Date(t.at).toISOString(),
          name,
          repository: 1,
          full_size: 1000,
          v2: true,
          tag_status: "active",
          tag_last_pushed: new Date(t.at).toISOString(),
          media_type: "application/vnd.oci.image.index.v1+json",
          content_type: "image",
          digest: t.digest
        }))
      return { body: this.paged(url, [...list, ...(this.rawTags.get(repo) ?? [])]) }
    }
    return null
  }
}

/** The four fakes together. */
export interface FakeSources {
  readonly github: FakeGitHub
  readonly gitlab: FakeGitLab
  readonly huggingface: FakeHuggingFace
  readonly dockerhub: FakeDockerHub
  readonly close: () => Promise<void>
}

/** Starts all four fakes on loopback. `gitlabPrefix` mounts GitLab under a path, like a self-hosted instance. */
export const start = async (options: { readonly gitlabPrefix?: string } = {}): Promise<FakeSources> => {
  const github = await new FakeGitHub().start()
  const gitlab = await new FakeGitLab(options.gitlabPrefix ?? "").start()
  const huggingface = await new FakeHuggingFace().start()
  const dockerhub = await new FakeDockerHub().start()
  return {
    github,
    gitlab,
    huggingface,
    dockerhub,
    close: async () => {
      await Promise.all([github.close(), gitlab.close(), huggingface.close(), dockerhub.close()])
    }
  }
}

const hex64 = (n: number) => {
  let h = ""
  for (let i = 0; h.length < 64; i++) h += ((n * 2654435761 + i * 40503) >>> 0).toString(16).padStart(8, "0")
  return `sha256:${h.slice(0, 64)}`
}

/**
 * Fills the four catalogues with `perSource` deterministic entries each,
 * their remote times spread over the `spreadMs` before `now` (for demos).
 */
export const seed = (fakes: FakeSources, now: number, perSource = 20, spreadMs = 30 * 86_400_000): void => {
  for (let i = 0; i < perSource; i++) {
    const at = now - Math.floor(((i + 1) / perSource) * spreadMs)
    fakes.github.put(`demo-org/repo-${i}`, at)
    fakes.gitlab.put(`demo-group/project-${i}`, at)
    fakes.huggingface.put((["models", "datasets", "spaces"] as const)[i % 3], `demo/hf-${i}`, at, Date.UTC(2020, 0, 1) + i * 86_400_000)
    fakes.dockerhub.tag(`demo/image-${i % Math.max(1, Math.ceil(perSource / 4))}`, `v${i}`, hex64(i + 1), at)
  }
}

/**
 * Changes `count` random entries of each catalogue at `now`, as pushes do:
 * a newer `pushed_at` / `last_activity_at` / `lastModified`, and a DockerHub
 * tag moved to a new digest. Returns the identities it touched.
 */
export const churn = (fakes: FakeSources, now: number, count: number, random: () => number = Math.random): ReadonlyArray<string> => {
  // Distinct entries, drawn from a snapshot: a touched entry moves to the front of its listing.
  const sample = <A>(xs: ReadonlyArray<A>): Array<A> => {
    const pool = [...xs]
    const out: Array<A> = []
    while (out.length < count && pool.length > 0) out.push(pool.splice(Math.floor(random() * pool.length), 1)[0])
    return out
  }
  const touched: Array<string> = []
  for (const e of sample(fakes.github.list())) {
    fakes.github.push(e.key, now)
    touched.push(`github:${e.key}`)
  }
  for (const e of sample(fakes.gitlab.list())) {
    fakes.gitlab.touch(e.key, now)
    touched.push(`gitlab:${e.key}`)
  }
  for (const e of sample(fakes.huggingface.list())) {
    const [kind, ...rest] = e.key.split("/")
    const created = Date.parse(String(e.record.createdAt))
    fakes.huggingface.put(kind as "models" | "datasets" | "spaces", rest.join("/"), now, Number.isFinite(created) ? created : undefined)
    touched.push(`huggingface:${e.key}`)
  }
  for (const e of sample(fakes.dockerhub.list())) {
    fakes.dockerhub.tag(e.key, "latest", hex64(Math.floor(random() * 1e9) + now), now)
    touched.push(`dockerhub:${e.key}:latest`)
  }
  return touched
}

/** The four fakes as a scoped resource, closed with the scope. */
export const scoped = (options: { readonly gitlabPrefix?: string } = {}): Effect.Effect<FakeSources, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.promise(() => start(options)),
    (f) => Effect.promise(() => f.close())
  )
