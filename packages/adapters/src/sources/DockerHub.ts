import { HttpClient, HttpClientRequest } from "@effect/platform"
import { Clock, Duration, Effect, Ref } from "effect"
import { z } from "zod"
import * as Records from "./Records.js"
import { SourceError, type MalformedRecord, type SourceClient, type SourceRecord } from "./SourceClient.js"
import * as SourceHttp from "./SourceHttp.js"

/** DockerHub client settings. */
export interface Settings extends Partial<SourceHttp.HttpSettings> {
  /** The namespaces (users or organisations) to list, in this order. */
  readonly namespaces: ReadonlyArray<string>
  /** With `token`: exchanged through `POST /v2/auth/token` for a short-lived bearer. */
  readonly username?: string
  /** A personal access token (with `username`), or a ready bearer JWT (without). */
  readonly token?: string
  /** Tags asked for per tag page. */
  readonly tagPageSize?: number
  /** Tag pages read per repository and cycle (the newest tags come first). */
  readonly maxTagPages?: number
}

/** A repository name as Docker allows it: lowercase letters and digits, separated by `.`, `_` or `-`. */
const repositoryName = /^[a-z0-9]+(?:[._-]+[a-z0-9]+)*$/
/** A tag as Docker allows it: a word character, then up to 127 of those, `.` and `-`. */
const tagName = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/

/** A repository in `GET /v2/namespaces/{ns}/repositories`. */
export const RepositorySchema = z.object({ name: z.string().max(255).regex(repositoryName, "must be a Docker repository name (lowercase letters and digits, separated by . _ or -)") })

/** An image of a tag (one per platform). */
export const ImageSchema = z.object({ digest: z.string().nullish() })

/** A tag in `GET /v2/namespaces/{ns}/repositories/{repo}/tags`. */
export const TagSchema = z.object({
  name: z.string().regex(tagName, "must be a Docker tag (letters, digits, _ . and -, at most 128)"),
  digest: z.string().nullish(),
  images: z.array(ImageSchema).nullish()
})

/** Both DockerHub listings share the paged envelope. */
export const PageSchema = z.object({
  count: z.number().optional(),
  next: z.string().nullish(),
  results: z.array(z.unknown())
})

/** `POST /v2/auth/token` */
export const TokenSchema = z.object({ access_token: z.string().min(1) })

const digestRe = /^sha256:[0-9a-f]{64}$/

/** The identity of an image tag: a new digest is a new target. */
export const identity = (namespace: string, repository: string, tag: string, digest: string): string => `${namespace}/${repository}:${tag}@${digest}`

/**
 * A DockerHub discovery client: each page is one page of a namespace's
 * repositories, expanded into the tags of each repository (the tag's
 * manifest-list digest, or its first image's digest). Records never carry a
 * remote timestamp: DockerHub targets are refreshed by digest, never promoted.
 *
 * @example
 * const client = yield* DockerHub.make({ namespaces: ["library"], username: "me", token: process.env.DOCKERHUB_TOKEN })
 */
export const make = (settings: Settings): Effect.Effect<SourceClient, never, HttpClient.HttpClient> =>
  Effect.gen(function* () {
    const s: SourceHttp.HttpSettings = SourceHttp.settingsOf({ ...SourceHttp.defaults, baseUrl: "https://hub.docker.com", pageSize: 100 }, settings)
    const tagPageSize = settings.tagPageSize ?? 100
    const maxTagPages = settings.maxTagPages ?? 1
    const client = yield* HttpClient.HttpClient
    const bearer = yield* Ref.make<string | null>(settings.username ? null : (settings.token ?? null))

    const tokenUrl = SourceHttp.url(s.baseUrl, "/v2/auth/token", {})
    const authFailure = (message: string, status?: number, reason: SourceError["reason"] = "auth") =>
      new SourceError({ reason, source: "dockerhub", url: tokenUrl, message, ...(status === undefined ? {} : { status }) })
    const exchangeOnce = client.execute(HttpClientRequest.post(tokenUrl).pipe(HttpClientRequest.bodyUnsafeJson({ identifier: settings.username, secret: settings.token }))).pipe(
      Effect.flatMap((r) => Effect.map(r.text, (text) => ({ status: r.status, headers: r.headers as Readonly<Record<string, string>>, text }))),
      Effect.timeoutFail({ duration: Duration.millis(s.timeoutMs), onTimeout: () => authFailure(`no token within ${s.timeoutMs} ms`, undefined, "timeout") }),
      Effect.catchTag("RequestError", "ResponseError", (e) => Effect.fail(authFailure(`token exchange failed: ${e.message}`, undefined, "network")))
    )
    // The token exchange retries as every request does: transient failures with backoff, rate limits waited out within bounds.
    const exchange = (retries: number, waits: number): Effect.Effect<string, SourceError> =>
      Effect.gen(function* () {
        const r = yield* Effect.either(exchangeOnce)
        const backoff = Effect.sleep(Duration.millis(Math.min(s.backoffMs * 2 ** retries, 30_000)))
        if (r._tag === "Left") {
          if (retries >= s.retries) return yield* Effect.fail(r.left)
          return yield* Effect.zipRight(backoff, exchange(retries + 1, waits))
        }
        const { status, headers, text } = r.right
        if (status === 200) {
          let body: unknown = null
          try {
            body = JSON.parse(text)
          } catch {
            // refused below
          }
          const token = TokenSchema.safeParse(body)
          if (!token.success) return yield* Effect.fail(authFailure("the token exchange answered 200 without an access_token", status))
          return token.data.access_token
        }
        const wait = SourceHttp.rateLimitWaitMs(status, headers, text, yield* Clock.currentTimeMillis)
        if (wait !== undefined) {
          if (waits >= s.maxRateLimitWaits || wait > s.maxRateLimitWaitMs)
            return yield* Effect.fail(authFailure(`the token exchange is rate limited (HTTP ${status}, wait ${Math.ceil(wait / 1000)} s)`, status, "rate_limited"))
          return yield* Effect.zipRight(Effect.sleep(Duration.millis(wait)), exchange(retries, waits + 1))
        }
        if (status >= 500 && retries < s.retries) return yield* Effect.zipRight(backoff, exchange(retries + 1, waits))
        return yield* Effect.fail(authFailure(`token exchange answered HTTP ${status}`, status))
      })
    const login = Effect.tap(exchange(0, 0), (token) => Ref.set(bearer, token))

    const auth = () =>
      Effect.gen(function* () {
        const have = yield* Ref.get(bearer)
        const token = have ?? (settings.username && settings.token ? yield* login : null)
        return token ? { authorization: `Bearer ${token}` } : ({} as Record<string, string>)
      })
    const raw = yield* SourceHttp.makeFetch("dockerhub", s, auth)
    // A refused bearer (the short-lived token expired) is dropped and the request sent once more with a new one.
    const dropBearer = (e: SourceError) => (e.reason === "auth" && settings.username ? Ref.set(bearer, null) : Effect.void)
    const fetch = (url: string) =>
      raw(url).pipe(
        Effect.catchIf(
          (e) => e.reason === "auth" && settings.username !== undefined,
          (e) => Effect.zipRight(dropBearer(e), raw(url))
        ),
        Effect.tapError(dropBearer)
      )

    const page = (url: string) =>
      Effect.gen(function* () {
        const res = yield* fetch(url)
        const p = PageSchema.safeParse(res.body)
        if (!p.success)
          return yield* Effect.fail(
            new SourceError({ reason: "malformed_page", source: "dockerhub", url: res.url, status: res.status, message: `unexpected page shape: ${SourceHttp.describeIssues(p.error.issues)}` })
          )
        const next = p.data.next ? yield* SourceHttp.sameOrigin("dockerhub", s.baseUrl, p.data.next, res.url) : null
        return { results: p.data.results, next }
      })

    return {
      source: "dockerhub",
      listings: settings.namespaces,
      fetchPage: (listing, cursor, now, room = Infinity) =>
        Effect.gen(function* () {
          const ns = settings.namespaces[listing]
          // Most recently updated first, as the other sources list: every cycle walks from the first page, so a
          // push reaches the first pages even when a namespace is longer than a cycle's page budget. (The API
          // documents no default order.)
          const repos = yield* page(
            cursor ?? SourceHttp.url(s.baseUrl, `/v2/namespaces/${encodeURIComponent(ns)}/repositories`, { page_size: s.pageSize, ordering: "-last_updated" })
          )
          const records: Array<SourceRecord> = []
          const malformed: Array<MalformedRecord> = []
          let requests = 1
          let truncated = false
          for (const rawRepo of repos.results) {
            // Records past the cycle's room would not be recorded: their tags are not fetched.
            if (records.length + malformed.length >= room) {
              truncated = true
              break
            }
            const repo = RepositorySchema.safeParse(rawRepo)
            if (!repo.success) {
              malformed.push({ identity: Records.guessIdentity(rawRepo, ["name", "namespace"]), reason: SourceHttp.describeIssues(repo.error.issues) })
              continue
            }
            const name = repo.data.name
            let url: string | null = SourceHttp.url(s.baseUrl, `/v2/namespaces/${encodeURIComponent(ns)}/repositories/${encodeURIComponent(name)}/tags`, {
              page_size: tagPageSize
            })
            const visited = new Set<string>()
            for (let n = 0; url !== null && n < maxTagPages && !visited.has(url); n++) {
              visited.add(url)
              // A repository whose tags cannot be read (deleted since it was listed, a broken page)
              // is set aside as malformed; the rest of the page goes on.
              const tags: { results: ReadonlyArray<unknown>; next: string | null } | SourceError = yield* page(url).pipe(
                Effect.catchIf(
                  (e) => e.reason === "malformed_page" || (e.reason === "http_status" && e.status !== undefined && e.status < 500),
                  (e) => Effect.succeed(e)
                )
              )
              requests++
              if (tags instanceof SourceError) {
                malformed.push({ identity: `${ns}/${name}`, reason: `its tags could not be read: ${tags.message}` })
                break
              }
              const read = Records.read(
                "dockerhub",
                tags.results,
                TagSchema,
                (t) => {
                  const digest = t.digest || t.images?.find((i) => i.digest)?.digest || null
                  if (digest === null || !digestRe.test(digest)) return { malformed: `tag ${t.name} has no valid sha256 digest` }
                  return { identity: identity(ns, name, t.name, digest), rawRemoteAt: undefined }
                },
                ["name"],
                now
              )
              // No remote timestamp is read: core's rule maps every DockerHub value to none, so these targets never promote.
              records.push(...read.records)
              // A tag's own name gets its repository; an identity that failed the identity rule is whole already.
              const prefix = `${ns}/${name}:`
              malformed.push(...read.malformed.map((m) => ({ ...m, identity: m.identity?.startsWith(prefix) ? m.identity : `${prefix}${m.identity ?? "?"}` })))
              url = tags.next
            }
          }
          return { records, malformed, next: repos.next, requests, truncated }
        })
    }
  })
