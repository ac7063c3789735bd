import { HttpRouter, HttpServerRequest } from "@effect/platform"
import { NodeHttpServerRequest } from "@effect/platform-node"
import { Effect } from "effect"
import type { z } from "zod"
import { ApiError, invalid } from "../ApiError.js"
import * as Url from "./Url.js"

// Reads the raw body ourselves so an oversized one gets a 413 answer rather
// than a reset connection: past the limit the rest is drained and dropped.
const readBody = (limit: number) =>
  Effect.flatMap(HttpServerRequest.HttpServerRequest, (req) => {
    const declared = Number(req.headers["content-length"] ?? Number.NaN)
    if (Number.isFinite(declared) && declared > limit) return Effect.fail(tooLarge(limit))
    const msg = NodeHttpServerRequest.toIncomingMessage(req)
    return Effect.async<string, ApiError>((resume) => {
      const chunks: Array<Buffer> = []
      let size = 0
      let over = false
      const onData = (c: Buffer) => {
        size += c.length
        if (size > limit) over = true
        else chunks.push(c)
      }
      const onEnd = () => {
        cleanup()
        resume(over ? Effect.fail(tooLarge(limit)) : Effect.succeed(Buffer.concat(chunks).toString("utf8")))
      }
      const onError = () => {
        cleanup()
        resume(Effect.fail(new ApiError({ status: 400, error: "body_unreadable", message: "the request body could not be read" })))
      }
      const cleanup = () => {
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

const tooLarge = (limit: number) =>
  new ApiError({ status: 413, error: "payload_too_large", message: `the request body exceeds ${limit} bytes`, issues: [{ path: [], message: `at most ${limit} bytes are accepted` }] })

/** Reads the body as JSON, refusing oversized and malformed input with a 4xx. */
export const json = (limit: number): Effect.Effect<unknown, ApiError, HttpServerRequest.HttpServerRequest> =>
  Effect.flatMap(readBody(limit), (text) =>
    Effect.try({
      try: (): unknown => JSON.parse(text),
      catch: (e) =>
        new ApiError({
          status: 400,
          error: "malformed_json",
          message: `the request body is not valid JSON: ${(e as Error).message}`,
          issues: [{ path: [], message: text.length === 0 ? "the body is empty; a JSON object is required" : "not valid JSON" }]
        })
    })
  )

/** Reads and validates a JSON body with a zod schema. */
export const body = <S extends z.ZodType>(schema: S, limit: number): Effect.Effect<z.output<S>, ApiError, HttpServerRequest.HttpServerRequest> =>
  Effect.flatMap(json(limit), (value) => {
    const r = schema.safeParse(value)
    return r.success ? Effect.succeed(r.data as z.output<S>) : Effect.fail(invalid("body", r.error))
  })

/** Validates the query string with a zod schema (repeated keys are refused). */
export const query = <S extends z.ZodType>(schema: S, omit: ReadonlyArray<string> = []): Effect.Effect<z.output<S>, ApiError, HttpServerRequest.HttpServerRequest> =>
  Effect.flatMap(HttpServerRequest.HttpServerRequest, (req) => {
    const url = Url.parse(req.url)
    const obj: Record<string, string | Array<string>> = {}
    for (const [k, v] of url.searchParams) {
      if (omit.includes(k)) continue
      const prev = obj[k]
      obj[k] = prev === undefined ? v : Array.isArray(prev) ? [...prev, v] : [prev, v]
    }
    const r = schema.safeParse(obj)
    return r.success ? Effect.succeed(r.data as z.output<S>) : Effect.fail(invalid("query", r.error))
  })

/** A positive integer path parameter. */
export const idParam = (name: string): Effect.Effect<number, ApiError, HttpRouter.RouteContext> =>
  Effect.flatMap(HttpRouter.params, (p) => {
    const v = p[name] ?? ""
    return /^[1-9][0-9]{0,14}$/.test(v)
      ? Effect.succeed(Number(v))
      : Effect.fail(
          new ApiError({ status: 400, error: "invalid_path", message: `${name} must be a positive integer`, issues: [{ path: [name], message: "must be a positive integer" }] })
        )
  })
