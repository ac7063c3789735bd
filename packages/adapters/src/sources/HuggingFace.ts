import type { HttpClient } from "@effect/platform"
import { Effect } from "effect"
import { z } from "zod"
import * as Records from "./Records.js"
import { SourceError, type SourceClient } from "./SourceClient.js"
import * as SourceHttp from "./SourceHttp.js"

/** The repository kinds of the Hub. */
export type Kind = "models" | "datasets" | "spaces"

/** HuggingFace client settings. */
export interface Settings extends Partial<SourceHttp.HttpSettings> {
  /** A user access token (read scope is enough), sent as `Authorization: Bearer`. */
  readonly token?: string
  /** Which kinds to list, in this order; all three by default. */
  readonly kinds?: ReadonlyArray<Kind>
  /** Extra filters, for example `{ author: "acme" }` or `{ search: "bert" }`. */
  readonly params?: Readonly<Record<string, string>>
}

/** A repository as the Hub lists it with `expand[]=lastModified`. */
export const RepoSchema = z.object({
  id: z.string().min(1),
  lastModified: z.unknown().optional()
})

/** `GET /api/{models,datasets,spaces}` */
export const PageSchema = z.array(z.unknown())

/**
 * A HuggingFace discovery client. Each kind is listed sorted by
 * `lastModified` descending, so a Space created years ago and updated today
 * is near the front; pages follow the cursor in the `Link: rel="next"` header.
 * Identities are `{kind}/{id}` (`spaces/acme/demo`): ids of different kinds may coincide.
 *
 * @example
 * const client = yield* HuggingFace.make({ token: process.env.HF_TOKEN, kinds: ["spaces"] })
 */
export const make = (settings: Settings = {}): Effect.Effect<SourceClient, never, HttpClient.HttpClient> =>
  Effect.gen(function* () {
    const s: SourceHttp.HttpSettings = SourceHttp.settingsOf({ ...SourceHttp.defaults, baseUrl: "https://huggingface.co", pageSize: 100 }, settings)
    const kinds = settings.kinds ?? ["models", "datasets", "spaces"]
    const headers: Record<string, string> = settings.token ? { authorization: `Bearer ${settings.token}` } : {}
    const fetch = yield* SourceHttp.makeFetch("huggingface", s, () => Effect.succeed(headers))
    return {
      source: "huggingface",
      listings: kinds,
      fetchPage: (listing, cursor, now) =>
        Effect.gen(function* () {
          const kind = kinds[listing]
          const url =
            cursor ??
            SourceHttp.url(s.baseUrl, `/api/${kind}`, {
              sort: "lastModified",
              direction: "-1",
              limit: s.pageSize,
              "expand[]": ["lastModified", "createdAt"],
              ...settings.params
            })
          const res = yield* fetch(url)
          const page = PageSchema.safeParse(res.body)
          if (!page.success)
            return yield* Effect.fail(
              new SourceError({ reason: "malformed_page", source: "huggingface", url: res.url, status: res.status, message: `unexpected page shape: ${SourceHttp.describeIssues(page.error.issues)}` })
            )
          const { records, malformed } = Records.read(
            "huggingface",
            page.data,
            RepoSchema,
            (r) => ({ identity: `${kind}/${r.id}`, rawRemoteAt: r.lastModified }),
            ["id", "_id"],
            now
          )
          const link = SourceHttp.nextLink(res.headers["link"])
          const next = link === null ? null : yield* SourceHttp.sameOrigin("huggingface", s.baseUrl, link, res.url)
          return { records, malformed: malformed.map((m) => ({ ...m, identity: m.identity && `${kind}/${m.identity}` })), next, requests: 1 }
        })
    }
  })
