import { HttpServerResponse } from "@effect/platform"
import { Database } from "@scanfleet/adapters"
import type { Errors, WorkerApi } from "@scanfleet/core"
import { Data } from "effect"
import type { z } from "zod"

type Issue = NonNullable<WorkerApi.ErrorBody["issues"]>[number]

/** A refusal at the HTTP edge: a status and the JSON error body sent with it. Nothing changed. */
export class ApiError extends Data.TaggedError("ApiError")<{
  readonly status: number
  readonly error: string
  readonly message: string
  readonly issues?: ReadonlyArray<Issue>
  /** The caller's own reservation that holds the slot a claim asked for (`claim_rejected:slot_busy`). */
  readonly holder?: Errors.SlotHolder
  /** Seconds after which a retry may succeed (sent as `Retry-After`). */
  readonly retryAfter?: number
  /** Close the connection after answering: the rest of the request was left unread. */
  readonly close?: boolean
  /** What the store said, for the server's log only (never sent): the reason and the database's message, cut to 300 characters. */
  readonly detail?: string
}> {}

/** The response of a refusal. */
export const toResponse = (e: ApiError): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.unsafeJson(
    { error: e.error, message: e.message, ...(e.issues ? { issues: e.issues } : {}), ...(e.holder ? { holder: e.holder } : {}) },
    {
      status: e.status,
      headers: {
        ...(e.retryAfter !== undefined ? { "retry-after": String(e.retryAfter) } : {}),
        ...(e.close ? { connection: "close" } : {})
      }
    }
  )

/**
 * zod issues as field paths. An unknown field becomes one issue at its own
 * path, so a client sees which key to remove.
 */
export const issuesOf = (error: z.ZodError, prefix: ReadonlyArray<string | number> = []): Array<Issue> =>
  error.issues.flatMap((i): Array<Issue> => {
    const path = [...prefix, ...i.path.map((k) => (typeof k === "symbol" ? String(k) : k))]
    if (i.code === "unrecognized_keys") return i.keys.map((k) => ({ path: [...path, k], message: `unknown field "${k}"` }))
    return [{ path, message: i.message }]
  })

/** 400 for a body, query or path that does not match its schema. */
export const invalid = (where: "body" | "query" | "path", error: z.ZodError, prefix: ReadonlyArray<string | number> = []) => {
  const issues = issuesOf(error, prefix)
  return new ApiError({
    status: 400,
    error: `invalid_${where}`,
    message: `the request ${where} is invalid: ${issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ")}`,
    issues
  })
}

/** 401: no credentials, or credentials that match nothing. */
export const unauthorized = (message: string) => new ApiError({ status: 401, error: "unauthorized", message })
/** 403: valid credentials without the right to this resource. */
export const forbidden = (message: string) => new ApiError({ status: 403, error: "forbidden", message })

/**
 * Each core error class maps to one status; the body carries its reason:
 * ClaimRejected 409, ReservationRefused 403, ProgressRejected 422, NotFound 404.
 */
export const fromClaimRejected = (e: Errors.ClaimRejected) =>
  new ApiError({
    status: 409,
    error: `claim_rejected:${e.reason}`,
    message: e.message,
    issues: e.reason === "capacity" || e.reason === "slot_busy" ? [{ path: ["slot"], message: e.message }] : undefined,
    holder: e.holder
  })

/** See `fromClaimRejected`. */
export const fromReservationRefused = (e: Errors.ReservationRefused) =>
  new ApiError({ status: 403, error: `reservation_refused:${e.reason}`, message: e.message, issues: e.reason === "stale_fence" ? [{ path: ["fence"], message: e.message }] : undefined })

/** See `fromClaimRejected`. The issue points at the refused event in the batch. */
export const fromProgressRejected = (e: Errors.ProgressRejected, index: number) =>
  new ApiError({ status: 422, error: `progress_rejected:${e.reason}`, message: e.message, issues: [{ path: ["events", index, "seq"], message: e.message }] })

/** See `fromClaimRejected`. */
export const fromNotFound = (e: Errors.NotFound) => new ApiError({ status: 404, error: "not_found", message: `${e.entity} ${e.key} does not exist` })

/**
 * A store failure, by what would help. The request's own data that the database
 * refused (`invalid`: a character or length or range it cannot store) is 400, and
 * a constraint it broke is 409: retrying the same request cannot help. An
 * unreachable, read-only, full or contended database is 503 with `Retry-After`
 * (the message says which): retrying later can. A corrupt database or a server
 * defect is 500. Nothing was changed.
 */
export const fromStoreError = (e: Errors.StoreError): ApiError => {
  const r = answerOf(e)
  return new ApiError({ status: r.status, error: r.error, message: r.message, issues: r.issues, retryAfter: r.retryAfter, detail: `${e.reason}: ${e.message}`.slice(0, 300) })
}

const answerOf = (e: Errors.StoreError): ApiError => {
  const unchanged = "nothing was changed by this request"
  switch (e.reason) {
    case "invalid":
      return new ApiError({ status: 400, error: "store_invalid", message: `the database refused a value of this request (${e.message.slice(0, 200)}); ${unchanged}`, issues: [{ path: [], message: "a value cannot be stored as sent" }] })
    case "constraint":
      return new ApiError({ status: 409, error: "store_constraint", message: `the request conflicts with stored data; ${unchanged}` })
    case "unavailable":
      return new ApiError({
        status: 503,
        error: "store_unavailable",
        message: `${Database.isReadOnly(e) ? "the database is read-only (a standby, or writes turned off)" : "the database cannot be reached"}; ${unchanged}; retry later`,
        retryAfter: 5
      })
    case "full":
      return new ApiError({ status: 503, error: "store_full", message: `the database is out of space or memory; ${unchanged}; retry later`, retryAfter: 30 })
    case "conflict":
      return new ApiError({ status: 503, error: "store_busy", message: `the database stayed locked by other work past the server's retries; ${unchanged}; retry`, retryAfter: 1 })
    case "corrupt":
    case "internal":
      return new ApiError({ status: 500, error: `store_${e.reason}`, message: `the store could not complete the request; ${unchanged}` })
  }
}
