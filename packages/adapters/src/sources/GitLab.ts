import type { HttpClient } from "@effect/platform"
import { Effect } from "effect"
import { z } from "zod"
import * as Records from "./Records.js"
import { SourceError, type SourceClient } from "./SourceClient.js"
import * as SourceHttp from "./SourceHttp.js"

/** GitLab client settings. `baseUrl` is the instance root (`https://gitlab.com` or a self-hosted one, path prefix allowed). */
export interface Settings extends Partial<SourceHttp.HttpSettings> {
  /** A personal, group or project access token, sent as `PRIVATE-TOKEN`. */
  readonly token?: string
  /** Extra filters of `GET /projects`, for example `{ visibility: "public" }` or `{ topic: "security" }`. */
  readonly params?: Readonly<Record<string, string>>
}

/** A project as GitLab lists it; only the fields discovery reads. */
export const ProjectSchema = z.object({
  path_with_namespace: z.string().min(1),
  last_activity_at: z.unknown().optional()
})

/** `GET /api/v4/projects` */
export const PageSchema = z.array(z.unknown())

/**
 * A GitLab discovery client listing projects by `last_activity_at`, newest
 * first. The next page comes from the `Link: rel="next"` header (keyset and
 * offset pagination both send it) or else from `X-Next-Page`.
 *
 * @example
 * const client = yield* GitLab.make({ baseUrl: "https://gitlab.example.org", token: process.env.GITLAB_TOKEN })
 */
export const make = (settings: Settings = {}): Effect.Effect<SourceClient, never, HttpClient.HttpClient> =>
  Effect.gen(function* () {
    const s: SourceHttp.HttpSettings = SourceHttp.settingsOf({ ...SourceHttp.defaults, baseUrl: "https://gitlab.com", pageSize: 100 }, settings)
    const headers: Record<string, string> = settings.token ? { "private-token": settings.token } : {}
    const fetch = yield* SourceHttp.makeFetch("gitlab", s, () => Effect.succeed(headers))
    const firstUrl = SourceHttp.url(s.baseUrl, "/api/v4/projects", {
      order_by: "last_activity_at",
      sort: "desc",
      simple: "true",
      per_page: s.pageSize,
      ...settings.params
    })
    return {
      source: "gitlab",
      listings: ["projects"],
      fetchPage: (_listing, cursor, now) =>
        Effect.gen(function* () {
          const res = yield* fetch(cursor ?? firstUrl)
          const page = PageSchema.safeParse(res.body)
          if (!page.success)
            return yield* Effect.fail(
              new SourceError({ reason: "malformed_page", source: "gitlab", url: res.url, status: res.status, message: `unexpected page shape: ${SourceHttp.describeIssues(page.error.issues)}` })
            )
          const { records, malformed } = Records.read(
            "gitlab",
            page.data,
            ProjectSchema,
            (p) => ({ identity: p.path_with_namespace, rawRemoteAt: p.last_activity_at }),
            ["path_with_namespace", "name", "id"],
            now
          )
          let next: string | null = SourceHttp.nextLink(res.headers["link"])
          const nextPage = (res.headers["x-next-page"] ?? "").trim()
          if (next === null && /^\d+$/.test(nextPage)) {
            const u = new URL(res.url)
            u.searchParams.set("page", nextPage)
            next = u.toString()
          }
          if (next !== null) next = yield* SourceHttp.sameOrigin("gitlab", s.baseUrl, next, res.url)
          return { records, malformed, next, requests: 1 }
        })
    }
  })
