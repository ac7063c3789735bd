import { HttpRouter, HttpServerRequest } from "@effect/platform"
import { NodeHttpServerRequest } from "@effect/platform-node"
import { WorkerApi } from "@scanfleet/core"
import { Effect } from "effect"
import type { z } from "zod"
import { ApiError, invalid } from "../ApiError.js"
import { Settings } from "../ServerConfig.js"

const tooLarge = (limit: number) =>
  new ApiError({
    status: 413,
    error: "payload_too_large",
    message: `the request body exceeds ${limit} bytes`,
    issues: [{ path: [], message: `at most ${limit} bytes are accepted` }],
    close: true
  })

// The request body bytes this process holds while reading them (bounded by each server's
// `maxBodyBytesInFlight` setting).
let bodyBytesInFlight = 0

/** What reading bodies holds now, in bytes. */
export const bodyBytesHeld = (): number => bodyBytesInFlight

const busy = (budget: number) =>
  new ApiError({
    status: 503,
    error: "server_busy",
    message: `the server holds its ${budget} bytes of request bodies being uploaded (maxBodyBytesInFlight); retry later`,
    retryAfter: 1,
    close: true
  })

/**
 * The raw body as text, read by us so an oversized one is answered with 413 the moment the
 * limit is crossed, chunked or not: the rest is never read, and the connection is closed
 * after the answer rather than kept open to swallow what the client still sends. JSON bodies
 * and the console's forms are both read this way. What it holds counts against the server's
 * `maxBodyBytesInFlight` until the body is complete or refused: past it, 503 `server_busy`
 * with `Retry-After` (the connection closed, the rest unread), so slow or stalled uploads
 * cannot grow the server without bound, however many connections carry them.
 */
export const readBody = (limit: number): Effect.Effect<string, ApiError, HttpServerRequest.HttpServerRequest | Settings> =>
  Effect.flatMap(Effect.zip(HttpServerRequest.HttpServerRequest, Settings), ([req, settings]) => {
    const budget = settings.maxBodyBytesInFlight
    const declared = Number(req.headers["content-length"] ?? Number.NaN)
    if (Number.isFinite(declared) && declared > limit) return Effect.fail(tooLarge(limit))
    const msg = NodeHttpServerRequest.toIncomingMessage(req)
    return Effect.async<string, ApiError>((resume) => {
      const chunks: Array<Buffer> = []
      let size = 0
      const stop = (e: ApiError) => {
        cleanup()
        msg.pause()
        resume(Effect.fail(e))
      }
      const onData = (c: Buffer) => {
        if (size + c.length > limit) return stop(tooLarge(limit))
        if (bodyBytesInFlight + c.length > budget) return stop(busy(budget))
        size += c.length
        bodyBytesInFlight += c.length
        chunks.push(c)
      }
      const onEnd = () => {
        cleanup()
        resume(Effect.succeed(Buffer.concat(chunks).toString("utf8")))
      }
      const onError = () => {
        cleanup()
        resume(Effect.fail(new ApiError({ status: 400, error: "body_unreadable", message: "the request body could not be read", issues: [{ path: [], message: "the body could not be read" }] })))
      }
      let held = true
      const cleanup = () => {
        if (held) bodyBytesInFlight -= size
        held = false
        msg.off("data", onData)
        msg.off("end", onEnd)
        msg.off("error", onError)
      }
      msg.on("data", onData)
      msg.on("end", onEnd)
      msg.on("error", onError)
      return Effect.sync(cleanup)
    })
  })

/**
 * The depth of the deepest array or object in JSON text, scanning no further than
 * one level past `max`: measured on the text, so a body nested thousands deep is
 * refused before it is parsed, and nothing downstream recurses through it.
 */
const depthPast = (text: string, max: number): number | undefined => {
  let depth = 0
  let inString = false
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (inString) {
      if (c === 92) i++ // backslash: skip the escaped character
      else if (c === 34) inString = false
    } else if (c === 34) inString = true
    else if (c === 91 || c === 123) {
      if (++depth > max) return i
    } else if (c === 93 || c === 125) depth--
  }
  return undefined
}


/** Why a string cannot cross the edge, if it cannot (core's rule, `WorkerApi.refuseString`). */
export const refuseString = WorkerApi.refuseString

/**
 * Reads the body as JSON, refusing with a 4xx what the server would not store
 * exactly or could not handle: over its byte limit (413, as soon as it is
 * crossed), nested deeper than `WorkerApi.maxJsonDepth`, malformed, or with a
 * string or key that holds a NUL, an unpaired surrogate or too many characters (400).
 */
export const json = (limit: number): Effect.Effect<unknown, ApiError, HttpServerRequest.HttpServerRequest | Settings> =>
  Effect.flatMap(readBody(limit), (text) => {
    const deep = depthPast(text, WorkerApi.maxJsonDepth)
    if (deep !== undefined)
      return Effect.fail(
        new ApiError({
          status: 400,
          error: "too_deep",
          message: `the request body nests arrays and objects deeper than ${WorkerApi.maxJsonDepth} levels (at character ${deep})`,
          issues: [{ path: [], message: `at most ${WorkerApi.maxJsonDepth} levels of nesting are accepted` }]
        })
      )
    let value: unknown
    try {
      value = JSON.parse(text)
    } catch (e) {
      return Effect.fail(
        new ApiError({
          status: 400,
          error: "malformed_json",
          message: `the request body is not valid JSON: ${(e as Error).message}`,
          issues: [{ path: [], message: text.length === 0 ? "the body is empty; a JSON object is required" : "not valid JSON" }]
        })
      )
    }
    const bad = WorkerApi.edgeIssue(value)
    return bad
      ? Effect.fail(new ApiError({ status: 400, error: "invalid_body", message: `the request body is invalid: ${bad.path.join(".") || "(root)"}: ${bad.message}`, issues: [{ path: [...bad.path], message: bad.message }] }))
      : Effect.succeed(value)
  })

/** Reads and validates a JSON body with a zod schema. */
export const body = <S extends z.ZodType>(schema: S, limit: number): Effect.Effect<z.output<S>, ApiError, HttpServerRequest.HttpServerRequest | Settings> =>
  Effect.flatMap(json(limit), (value) => {
    const r = schema.safeParse(value)
    return r.success ? Effect.succeed(r.data as z.output<S>) : Effect.fail(invalid("body", r.error))
  })

/**
 * Validates the query string with a zod schema (repeated keys are refused, and so
 * is any key or value that holds a NUL or exceeds `WorkerApi.maxQueryLength`).
 */
export const query = <S extends z.ZodType>(schema: S, omit: ReadonlyArray<string> = []): Effect.Effect<z.output<S>, ApiError, HttpServerRequest.HttpServerRequest> =>
  Effect.flatMap(HttpServerRequest.HttpServerRequest, (req) => {
    const obj: Record<string, string | Array<string>> = {}
    for (const [rawKey, k, v] of queryPairs(req.url)) {
      if (k !== undefined && omit.includes(k)) continue
      const why =
        k === undefined || v === undefined ? "is not UTF-8 once percent-decoded" : (refuseString(k, WorkerApi.maxQueryLength) ?? refuseString(v, WorkerApi.maxQueryLength))
      const at = (k ?? rawKey).slice(0, WorkerApi.maxQueryLength)
      if (why)
        return Effect.fail(new ApiError({ status: 400, error: "invalid_query", message: `the request query is invalid: ${at.slice(0, 64)}: ${why}`, issues: [{ path: [at], message: why }] }))
      if (k === undefined || v === undefined) continue
      const prev = obj[k]
      obj[k] = prev === undefined ? v : Array.isArray(prev) ? [...prev, v] : [prev, v]
    }
    const r = schema.safeParse(obj)
    return r.success ? Effect.succeed(r.data as z.output<S>) : Effect.fail(invalid("query", r.error))
  })

/**
 * An optional text header, its bytes read as UTF-8: refused with 400 when they are not UTF-8, or
 * when it holds a NUL, a control character (C0 or C1) or a bidirectional control, or exceeds `max`
 * characters (a header is never silently cut).
 */
export const textHeader = (name: string, max: number): Effect.Effect<string | undefined, ApiError, HttpServerRequest.HttpServerRequest> =>
  Effect.flatMap(HttpServerRequest.HttpServerRequest, (req) => {
    const raw = req.headers[name.toLowerCase()]
    if (raw === undefined) return Effect.succeed(undefined)
    // Node reads a header's bytes one character each (Latin-1); clients send UTF-8.
    let v: string | undefined
    try {
      v = utf8.decode(Buffer.from(raw, "latin1"))
    } catch {
      v = undefined
    }
    if (v === undefined) return Effect.fail(badHeader(name, "is not UTF-8"))
    const why = WorkerApi.labelProblem(v.trim()) ?? refuseString(v, max)
    return why ? Effect.fail(badHeader(name, why)) : Effect.succeed(v)
  })

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true })

/**
 * The query's pairs in order, as the form encoding reads them (`&` between pairs, `+` a space,
 * `%XX` a byte, a malformed `%` kept as it is), except that bytes which are not UTF-8 are not
 * replaced: such a key or value is `undefined`, so the request is refused rather than read as
 * another text. Each pair also carries its key as sent, to name it in a refusal.
 */
export const queryPairs = (target: string): Array<readonly [raw: string, key: string | undefined, value: string | undefined]> => {
  const start = target.indexOf("?")
  if (start < 0) return []
  const end = target.indexOf("#", start)
  const pairs: Array<readonly [string, string | undefined, string | undefined]> = []
  for (const part of target.slice(start + 1, end < 0 ? undefined : end).split("&")) {
    if (part === "") continue
    const eq = part.indexOf("=")
    const rawKey = eq < 0 ? part : part.slice(0, eq)
    pairs.push([rawKey, formDecode(rawKey), formDecode(eq < 0 ? "" : part.slice(eq + 1))])
  }
  return pairs
}

// Node reads the request target's bytes one character each (Latin-1), as for headers.
const formDecode = (s: string): string | undefined => {
  const bytes: Array<number> = []
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i)
    if (c === 0x2b) bytes.push(0x20)
    else if (c === 0x25 && /^[0-9A-Fa-f]{2}$/.test(s.slice(i + 1, i + 3))) {
      bytes.push(parseInt(s.slice(i + 1, i + 3), 16))
      i += 2
    } else if (c > 0xff) return undefined
    else bytes.push(c)
  }
  try {
    return utf8.decode(Uint8Array.from(bytes))
  } catch {
    return undefined
  }
}

const badHeader = (name: string, why: string) =>
  new ApiError({ status: 400, error: "invalid_header", message: `the ${name} header ${why}`, issues: [{ path: ["headers", name.toLowerCase()], message: why }] })

/** Longest \`X-Scanfleet-Actor\` header accepted, in characters. */
export const maxActorLength = WorkerApi.maxActorLength

/**
 * Who an operator request names itself (\`X-Scanfleet-Actor\`), trimmed, else \`admin\`: over
 * \`maxActorLength\` characters or with a control character it is 400 \`invalid_header\`, on every
 * endpoint that reads it.
 */
export const actorHeader: Effect.Effect<string, ApiError, HttpServerRequest.HttpServerRequest> = Effect.map(
  textHeader("x-scanfleet-actor", maxActorLength),
  (v) => v?.trim() || "admin"
)

const invalidPath = (name: string, message: string) =>
  new ApiError({ status: 400, error: "invalid_path", message: `${name} ${message}`, issues: [{ path: [name], message }] })

const pathPart = (target: string): string => {
  const q = target.indexOf("?")
  return q === -1 ? target : target.slice(0, q)
}

const decodes = (segment: string): boolean => {
  try {
    decodeURIComponent(segment)
    return true
  } catch {
    return false
  }
}

/**
 * The request target as the router is to read it: split into the same segments as the
 * client sent. The router (find-my-way) takes `;` and `#` for the start of a query and
 * refuses to route a path whose percent-encoding is not UTF-8, so `/v1/assignments/1;x/result`
 * matched no route and `GET /v1/assignments/1;x` was routed as `/v1/assignments/1`. Here those
 * characters are escaped (and every `%` of a segment that does not decode), so every such path
 * reaches its route, whose parameter is then refused as not exactly its schema
 * (`pathParam`), and a static segment with them matches no route. The query is left as sent.
 */
export const routable = (target: string): string => {
  const path = pathPart(target)
  if (!/[;#%]/.test(path)) return target
  const escaped = path
    .split("/")
    .map((segment) => (decodes(segment) ? segment : segment.replaceAll("%", "%25")).replaceAll(";", "%3B").replaceAll("#", "%23"))
    .join("/")
  return escaped + target.slice(path.length)
}

// The router ignores a trailing slash, so the parameter it hands over may be only part of
// what the client sent: the segment is compared with the target as the client sent it.
const rawSegment = (target: string, index: number, count: number): { readonly segment: string } | "count" | "encoding" => {
  const segments = pathPart(target).split("/")
  if (segments.length !== count) return "count"
  try {
    return { segment: decodeURIComponent(segments[index]) }
  } catch {
    return "encoding"
  }
}

/**
 * A path parameter: the whole path segment, exactly as the client sent it (so `1;x`, `1/`,
 * `1#x` and a segment whose percent-encoding is not UTF-8 are refused), read by `read`, which
 * answers `undefined` for a value that is not `expected`. Every refusal is 400 `invalid_path`
 * at the parameter, never the resource the segment starts with.
 */
export const pathParam = <A>(
  name: string,
  expected: string,
  read: (segment: string) => A | undefined
): Effect.Effect<A, ApiError, HttpRouter.RouteContext | HttpServerRequest.HttpServerRequest> =>
  Effect.gen(function* () {
    const ctx = yield* HttpRouter.RouteContext
    const req = yield* HttpServerRequest.HttpServerRequest
    const route = ctx.route.path.split("/")
    const raw = rawSegment(req.originalUrl, route.indexOf(`:${name}`), route.length)
    if (raw === "encoding") return yield* Effect.fail(invalidPath(name, "is not percent-encoded UTF-8"))
    const v = ctx.params[name] ?? ""
    if (raw === "count" || raw.segment !== v) return yield* Effect.fail(invalidPath(name, `must be one path segment holding ${expected}, with nothing after it`))
    const a = read(v)
    return a === undefined ? yield* Effect.fail(invalidPath(name, `must be ${expected}`)) : a
  })

/**
 * A positive integer path parameter: the whole path segment, exactly, so `1;x`,
 * `1/`, `01` and `1.0` are refused with 400 rather than read as reservation 1.
 */
export const idParam = (name: string): Effect.Effect<number, ApiError, HttpRouter.RouteContext | HttpServerRequest.HttpServerRequest> =>
  pathParam(name, "a positive integer", (v) => (/^[1-9][0-9]{0,14}$/.test(v) ? Number(v) : undefined))
