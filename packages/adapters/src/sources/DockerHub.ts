import { HttpClient, HttpClientRequest } from "@effect/platform"
import { Duration, Effect, Ref } from "effect"
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

/** A repository in `GET /v2/namespaces/{ns}/repositories`. */
export const RepositorySchema = z.object({ name: z.string().min(1) })

/** An image of a tag (one per platform). */
export const ImageSchema = z.object({ digest: z.string().nullish() })

/** A tag in `GET /v2/namespaces/{ns}/repositories/{repo}/tags`. */
export const TagSchema = z.object({
  name: z.string().min(1),
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
    const s: SourceHttp.HttpSettings = { ...SourceHttp.defaults, baseUrl: "https://hub.docker.com", pageSize: 100, ...settings }
    const tagPageSize = settings.tagPageSize ?? 100
    const maxTagPages = settings.maxTagPages ?? 1
    const client = yield* HttpClient.HttpClient
    const bearer = yield* Ref.make<string | null>(settings.username ? null : (settings.token ?? null))

    const login = Effect.gen(function* () {
      const url = SourceHttp.url(s.baseUrl, "/v2/auth/token", {})
      const fail = (message: string, status?: number) =>
        new SourceError({ reason: "auth", source: "dockerhub", url, message, ...(status === undefined ? {} : { status }) })
      const res = yield* client
        .execute(HttpClientRequest.post(url).pipe(HttpClientRequest.bodyUnsafeJson({ identifier: settings.username, secret: settings.token })))
        .pipe(
          Effect.flatMap((r) => Effect.map(r.json, (body) => ({ status: r.status, body }))),
          Effect.timeoutFail({ duration: Duration.millis(s.timeoutMs), onTimeout: () => fail(`no token within ${s.timeoutMs} ms`) }),
          Effect.catchTag("RequestError", "ResponseError", (e) => Effect.fail(fail(`token exchange failed: ${e.message}`)))
        )
      const token = TokenSchema.safeParse(res.body)
      if (res.status !== 200 || !token.success) return yield* Effect.fail(fail(`token exchange answered HTTP ${res.status}`, res.status))
      yield* Ref.set(bearer, token.data.access_token)
      return token.data.access_token
    })

    const auth = () =>
      Effect.gen(function* () {
        const have = yield* Ref.get(bearer)
        const token = have ?? (settings.username && settings.token ? yield* login : null)
        return token ? { authorization: `Bearer ${token}` } : ({} as Record<string, string>)
      })
    const raw = yield* SourceHttp.makeFetch("dockerhub", s, auth)
    // A refused bearer (the short-lived token expired) is dropped so the next request logs in again.
    const fetch = (url: string) =>
      raw(url).pipe(Effect.tapError((e) => (e.reason === "auth" && settings.username ? Ref.set(bearer, null) : Effect.void)))

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
      fetchPage: (listing, cursor, now) =>
        Effect.gen(function* () {
          const ns = settings.namespaces[listing]
          const repos = yield* page(cursor ?? SourceHttp.url(s.baseUrl, `/v2/namespaces/${encodeURIComponent(ns)}/repositories`, { page_size: s.pageSize }))
          const records: Array<SourceRecord> = []
          const malformed: Array<MalformedRecord> = []
          let requests = 1
          for (const rawRepo of repos.results) {
            const repo = RepositorySchema.safeParse(rawRepo)
            if (!repo.success) {
              malformed.push({ identity: Records.guessIdentity(rawRepo, ["name", "namespace"]), reason: SourceHttp.describeIssues(repo.error.issues) })
              continue
            }
            const name = repo.data.name
            let url: string | null = SourceHttp.url(s.baseUrl, `/v2/namespaces/${encodeURIComponent(ns)}/repositories/${encodeURIComponent(name)}/tags`, {
              page_size: tagPageSize
            })
            for (let n = 0; url !== null && n < maxTagPages; n++) {
              const tags: { results: ReadonlyArray<unknown>; next: string | null } = yield* page(url)
              requests++
              const read = Records.read(
                "dockerhub",
                tags.results,
                TagSchema,
                (t) => {
                  const digest = t.digest ?? t.images?.find((i) => i.digest)?.digest ?? null
                  if (digest === null || !digestRe.test(digest)) return { malformed: `tag ${t.name} has no valid sha256 digest` }
                  return { identity: identity(ns, name, t.name, digest), rawRemoteAt: undefined }
                },
                ["name"],
                now
              )
              // No remote timestamp is read: core's rule maps every DockerHub value to none, so these targets never promote.
              records.push(...read.records)
              malformed.push(...read.malformed.map((m) => ({ ...m, identity: `${ns}/${name}:${m.identity ?? "?"}` })))
              url = tags.next
            }
          }
          return { records, malformed, next: repos.next, requests }
        })
    }
  })
