import type { HttpClient } from "@effect/platform"
import { Effect } from "effect"
import { z } from "zod"
import * as Records from "./Records.js"
import { SourceError, type SourceClient } from "./SourceClient.js"
import * as SourceHttp from "./SourceHttp.js"

/** What to list: a repository search sorted by last update, or an organisation's or user's repositories sorted by last push. */
export type Listing =
  | { readonly kind: "search"; readonly query: string }
  | { readonly kind: "org"; readonly org: string }
  | { readonly kind: "user"; readonly user: string }

/** GitHub client settings. */
export interface Settings extends Partial<SourceHttp.HttpSettings> {
  /** A personal access token or app installation token, sent as `Authorization: Bearer`. */
  readonly token?: string
  readonly listings: ReadonlyArray<Listing>
}

/** A repository as GitHub lists it; only the fields discovery reads. */
export const RepositorySchema = z.object({
  full_name: z.string().min(1),
  // Parsed by core's rule, not here: a malformed value admits the record without a timestamp.
  pushed_at: z.unknown().optional()
})

/** `GET /search/repositories` */
export const SearchPageSchema = z.object({
  total_count: z.number(),
  incomplete_results: z.boolean(),
  items: z.array(z.unknown())
})

/** `GET /orgs/{org}/repos` and `GET /users/{user}/repos` */
export const ListPageSchema = z.array(z.unknown())

const first = (s: SourceHttp.HttpSettings, l: Listing): string => {
  switch (l.kind) {
    case "search":
      return SourceHttp.url(s.baseUrl, "/search/repositories", { q: l.query, sort: "updated", order: "desc", per_page: s.pageSize })
    case "org":
      return SourceHttp.url(s.baseUrl, `/orgs/${encodeURIComponent(l.org)}/repos`, { type: "public", sort: "pushed", direction: "desc", per_page: s.pageSize })
    case "user":
      return SourceHttp.url(s.baseUrl, `/users/${encodeURIComponent(l.user)}/repos`, { type: "owner", sort: "pushed", direction: "desc", per_page: s.pageSize })
  }
}

/** A listing's name in logs. */
export const describe = (l: Listing): string => (l.kind === "search" ? `search:${l.query}` : l.kind === "org" ? `org:${l.org}` : `user:${l.user}`)

/**
 * A GitHub discovery client. Pages follow the `Link: rel="next"` header;
 * the remote timestamp is `pushed_at`.
 *
 * @example
 * const client = yield* GitHub.make({ token: process.env.GITHUB_TOKEN, listings: [{ kind: "org", org: "nodejs" }] })
 */
export const make = (settings: Settings): Effect.Effect<SourceClient, never, HttpClient.HttpClient> =>
  Effect.gen(function* () {
    const s: SourceHttp.HttpSettings = SourceHttp.settingsOf({ ...SourceHttp.defaults, baseUrl: "https://api.github.com", pageSize: 100 }, settings)
    const headers: Record<string, string> = {
      accept: "application/vnd.github+json",
      "x-github-api-version": "2022-11-28",
      ...(settings.token ? { authorization: `Bearer ${settings.token}` } : {})
    }
    const fetch = yield* SourceHttp.makeFetch("github", s, () => Effect.succeed(headers))
    return {
      source: "github",
      listings: settings.listings.map(describe),
      fetchPage: (listing, cursor, now) =>
        Effect.gen(function* () {
          const l = settings.listings[listing]
          const res = yield* fetch(cursor ?? first(s, l))
          const page = l.kind === "search" ? SearchPageSchema.safeParse(res.body) : ListPageSchema.safeParse(res.body)
          if (!page.success)
            return yield* Effect.fail(
              new SourceError({ reason: "malformed_page", source: "github", url: res.url, status: res.status, message: `unexpected page shape: ${SourceHttp.describeIssues(page.error.issues)}` })
            )
          const items = Array.isArray(page.data) ? page.data : page.data.items
          const { records, malformed } = Records.read(
            "github",
            items,
            RepositorySchema,
            (r) => ({ identity: r.full_name, rawRemoteAt: r.pushed_at }),
            ["full_name", "name", "id"],
            now
          )
          const link = SourceHttp.nextLink(res.headers["link"])
          const next = link === null ? null : yield* SourceHttp.sameOrigin("github", s.baseUrl, link, res.url)
          return { records, malformed, next, requests: 1 }
        })
    }
  })
