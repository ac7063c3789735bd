import { HttpClient, HttpClientRequest } from "@effect/platform"
import { Chunk, Clock, Duration, Effect, Ref, Stream } from "effect"
import type { Source } from "@scanfleet/core"
import { SourceError } from "./SourceClient.js"

/** Transport settings every source client shares. */
export interface HttpSettings {
  /** API root, without a trailing slash (a self-hosted GitLab, a test server). */
  readonly baseUrl: string
  /** Records asked for per page. */
  readonly pageSize: number
  /** Per request, headers and body together, milliseconds. */
  readonly timeoutMs: number
  /** Extra attempts after a 5xx, a network error or a timeout. */
  readonly retries: number
  /** First backoff, doubled per retry, milliseconds. */
  readonly backoffMs: number
  /** The longest single wait a rate limit may impose; a longer one ends the cycle. */
  readonly maxRateLimitWaitMs: number
  /** How many rate-limit waits one request may sit through. */
  readonly maxRateLimitWaits: number
  /** The largest response body read, in bytes; a larger one is a malformed page, read no further. */
  readonly maxResponseBytes: number
  readonly userAgent: string
}

/** Transport defaults; each client sets its own `baseUrl` and `pageSize`. */
export const defaults: Omit<HttpSettings, "baseUrl" | "pageSize"> = {
  timeoutMs: 30_000,
  retries: 3,
  backoffMs: 500,
  maxRateLimitWaitMs: 60_000,
  maxRateLimitWaits: 3,
  maxResponseBytes: 32 * 1024 * 1024,
  userAgent: "scanfleet-discovery"
}

/**
 * A client's settings: the defaults, the client's own, then what the caller gave. A
 * setting given as `undefined` keeps its default (a spread alone would erase it).
 */
export const settingsOf = <S extends object>(base: S, given: Partial<S>): S => {
  const out: Record<string, unknown> = { ...(base as Record<string, unknown>) }
  for (const [k, v] of Object.entries(given)) if (v !== undefined) out[k] = v
  return out as S
}

/** How far ahead a rate-limit reset may lie: a later one is not believed (a reset in milliseconds, a garbled header). */
export const maxResetAheadMs = 24 * 3_600_000

/**
 * The wait until a rate-limit reset given as epoch seconds, or undefined when the header
 * is missing, not a number, or further ahead than `maxResetAheadMs`.
 */
export const resetWaitMs = (header: string | undefined, now: number): number | undefined => {
  if (header === undefined || header.trim() === "") return undefined
  const reset = Number(header)
  if (!Number.isFinite(reset)) return undefined
  const ms = reset * 1000 - now
  return ms > maxResetAheadMs ? undefined : Math.max(0, ms)
}

/** A decoded JSON response. */
export interface JsonResponse {
  readonly url: string
  readonly status: number
  readonly headers: Readonly<Record<string, string>>
  readonly body: unknown
}

/** The URL of the `rel="next"` entry of an RFC 8288 Link header, if any. */
export const nextLink = (header: string | undefined): string | null => {
  if (!header) return null
  for (const m of header.matchAll(/<([^>]*)>([^<]*)/g)) {
    const rel = /;\s*rel\s*=\s*"?([^";]*)"?/i.exec(m[2] ?? "")
    if (rel && rel[1].trim().split(/\s+/).includes("next")) return m[1]
  }
  return null
}

/** Seconds to wait from a `Retry-After` header (delta seconds or an HTTP date), if present. */
export const retryAfterMs = (header: string | undefined, now: number): number | undefined => {
  if (header === undefined || header.trim() === "") return undefined
  const s = Number(header.trim())
  if (Number.isFinite(s)) return Math.max(0, s * 1000)
  const t = Date.parse(header)
  return Number.isFinite(t) ? Math.max(0, t - now) : undefined
}

/**
 * How long a response says to wait before the next request, or undefined when
 * it is not a rate-limit response. 429 is always one; 403 is one when it says
 * so (GitHub's primary limit: remaining 0 with a reset time; its secondary
 * limit: Retry-After, or a message about rate limits, where GitHub asks for at
 * least a minute). Without any hint a 429 waits a minute.
 */
export const rateLimitWaitMs = (status: number, headers: Readonly<Record<string, string>>, bodyText: string, now: number): number | undefined => {
  if (status !== 429 && status !== 403) return undefined
  const after = retryAfterMs(headers["retry-after"], now)
  if (after !== undefined) return after
  // GitHub and DockerHub: X-RateLimit-*; GitLab: RateLimit-* (reset as epoch seconds).
  for (const prefix of ["x-ratelimit-", "ratelimit-"]) {
    const wait = headers[`${prefix}remaining`] === "0" ? resetWaitMs(headers[`${prefix}reset`], now) : undefined
    if (wait !== undefined) return wait
  }
  // HuggingFace: the IETF draft header `RateLimit: "api";r=0;t=55` (t: seconds until the window resets).
  const t = /(?:^|;)\s*t=(\d+)/.exec(headers["ratelimit"] ?? "")
  if (t) return Number(t[1]) * 1000
  if (status === 429) return 60_000
  return /rate limit/i.test(bodyText) ? 60_000 : undefined
}

type Attempt =
  | { readonly _tag: "ok"; readonly response: JsonResponse }
  | { readonly _tag: "transient"; readonly error: SourceError }
  | { readonly _tag: "wait"; readonly ms: number; readonly status: number }

/** A function fetching one URL as JSON with the client's auth, retries and rate-limit handling. */
export type Fetch = (url: string) => Effect.Effect<JsonResponse, SourceError>

/**
 * Builds the JSON fetcher of one source client. Transient failures (5xx,
 * network, timeout) are retried with exponential backoff; rate-limit
 * responses are waited out when the wait is within `maxRateLimitWaitMs`, and
 * a response announcing an exhausted quota (`X-RateLimit-Remaining: 0`) makes
 * the next request wait for the reset, within the same bound.
 */
export const makeFetch = (
  source: Source.Source,
  settings: HttpSettings,
  auth: (url: string) => Effect.Effect<Record<string, string>, SourceError>
): Effect.Effect<Fetch, never, HttpClient.HttpClient> =>
  Effect.gen(function* () {
    const client = yield* HttpClient.HttpClient
    const blockedUntil = yield* Ref.make(0)
    const fail = (reason: SourceError["reason"], url: string, message: string, status?: number) =>
      new SourceError({ reason, source, url, message, ...(status === undefined ? {} : { status }) })
    const tooLarge = (url: string, status: number, what: string) =>
      fail("malformed_page", url, `the response is larger than the ${settings.maxResponseBytes} bytes read (maxResponseBytes): it ${what}`, status)

    const waitBounded = (ms: number, url: string, status?: number) =>
      ms > settings.maxRateLimitWaitMs
        ? Effect.fail(
            fail("rate_limited", url, `rate limited: the API asks to wait ${Math.ceil(ms / 1000)} s, more than the ${Math.ceil(settings.maxRateLimitWaitMs / 1000)} s allowed`, status)
          )
        : Effect.sleep(Duration.millis(ms))

    const attempt = (url: string): Effect.Effect<Attempt, SourceError> =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const until = yield* Ref.get(blockedUntil)
        if (until > now) yield* waitBounded(until - now, url)
        const headers = yield* auth(url)
        const request = HttpClientRequest.get(url).pipe(
          HttpClientRequest.setHeaders({ accept: "application/json", "user-agent": settings.userAgent, ...headers })
        )
        const exchange = Effect.gen(function* () {
          const res = yield* client.execute(request)
          const declared = Number(res.headers["content-length"])
          if (Number.isFinite(declared) && declared > settings.maxResponseBytes) return yield* Effect.fail(tooLarge(url, res.status, `declares ${declared} bytes`))
          // Read chunk by chunk, and no further than the limit.
          let size = 0
          const chunks = yield* res.stream.pipe(
            Stream.mapEffect((c) => {
              size += c.byteLength
              return size > settings.maxResponseBytes ? Effect.fail(tooLarge(url, res.status, `was still sending after ${settings.maxResponseBytes} bytes`)) : Effect.succeed(c)
            }),
            Stream.runCollect
          )
          const text = Buffer.concat(Chunk.toArray(chunks)).toString("utf8")
          return { status: res.status, headers: res.headers as Readonly<Record<string, string>>, text }
        }).pipe(
          Effect.timeoutFail({ duration: Duration.millis(settings.timeoutMs), onTimeout: () => fail("timeout", url, `no complete response within ${settings.timeoutMs} ms`) }),
          Effect.either
        )
        const r = yield* exchange
        if (r._tag === "Left") {
          const e = r.left
          // A body over the limit would be as large again on a retry.
          if (e._tag === "SourceError" && e.reason === "malformed_page") return yield* Effect.fail(e)
          return { _tag: "transient", error: e._tag === "SourceError" ? e : fail("network", url, `network error: ${e.message}`) } as const
        }
        const { status, headers: h, text } = r.right
        const at = yield* Clock.currentTimeMillis
        const untilReset = h["x-ratelimit-remaining"] === "0" ? resetWaitMs(h["x-ratelimit-reset"], at) : undefined
        if (untilReset !== undefined) yield* Ref.set(blockedUntil, at + untilReset)
        if (status >= 200 && status < 300) {
          let body: unknown
          try {
            body = JSON.parse(text)
          } catch {
            return yield* Effect.fail(fail("malformed_page", url, `the response body is not JSON (${text.length} bytes, starts ${JSON.stringify(text.slice(0, 40))})`, status))
          }
          return { _tag: "ok", response: { url, status, headers: h, body } } as const
        }
        const wait = rateLimitWaitMs(status, h, text, at)
        if (wait !== undefined) return { _tag: "wait", ms: wait, status } as const
        if (status >= 500) return { _tag: "transient", error: fail("http_status", url, `HTTP ${status}`, status) } as const
        if (status === 401) return yield* Effect.fail(fail("auth", url, `HTTP 401: the token was refused`, status))
        return yield* Effect.fail(fail("http_status", url, `HTTP ${status}: ${text.slice(0, 200)}`, status))
      })

    const loop = (url: string, retries: number, waits: number): Effect.Effect<JsonResponse, SourceError> =>
      Effect.flatMap(attempt(url), (a) => {
        switch (a._tag) {
          case "ok":
            return Effect.succeed(a.response)
          case "transient":
            if (retries >= settings.retries) return Effect.fail(a.error)
            return Effect.sleep(Duration.millis(Math.min(settings.backoffMs * 2 ** retries, 30_000))).pipe(Effect.zipRight(loop(url, retries + 1, waits)))
          case "wait":
            if (waits >= settings.maxRateLimitWaits)
              return Effect.fail(fail("rate_limited", url, `still rate limited after ${waits} waits`, a.status))
            return waitBounded(a.ms, url, a.status).pipe(Effect.zipRight(loop(url, retries, waits + 1)))
        }
      })

    return (url: string) => loop(url, 0, 0)
  })

/** Resolves a next-page URL and refuses one that leaves the configured API origin (the token would follow it). */
export const sameOrigin = (source: Source.Source, baseUrl: string, next: string, current: string): Effect.Effect<string, SourceError> => {
  try {
    const u = new URL(next, current)
    if (u.origin !== new URL(baseUrl).origin)
      return Effect.fail(new SourceError({ reason: "malformed_page", source, url: current, message: `the next-page link points to ${u.origin}, outside ${baseUrl}` }))
    return Effect.succeed(u.toString())
  } catch {
    return Effect.fail(new SourceError({ reason: "malformed_page", source, url: current, message: `the next-page link ${JSON.stringify(next)} is not a URL` }))
  }
}

/** Joins a base URL and a path with query parameters. Array values repeat the key. */
export const url = (baseUrl: string, path: string, params: Record<string, string | number | ReadonlyArray<string> | undefined>): string => {
  const u = new URL(baseUrl.replace(/\/+$/, "") + path)
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined) continue
    if (Array.isArray(v)) for (const x of v) u.searchParams.append(k, x)
    else u.searchParams.set(k, String(v))
  }
  return u.toString()
}

/** A short description of a zod error for logs and cycle records. */
export const describeIssues = (issues: ReadonlyArray<{ readonly path: ReadonlyArray<PropertyKey>; readonly message: string }>): string =>
  issues
    .slice(0, 3)
    .map((i) => `${i.path.map(String).join(".") || "(root)"}: ${i.message}`)
    .join("; ")
