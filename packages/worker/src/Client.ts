import { type PhaseModel, WorkerApi } from "@scanfleet/core"
import { Data, Effect } from "effect"
import type { z } from "zod"

/**
 * The Worker API client. Every response is parsed with core's contract
 * schemas. Failures come in two kinds: the server could not be reached (or
 * answered as if overloaded), which the caller retries; and the server refused
 * the request, which no retry will change.
 */

/** The server could not be reached, timed out, or answered 5xx/408/429/401; retrying may help. */
export class ApiUnreachable extends Data.TaggedError("ApiUnreachable")<{ readonly message: string; readonly status?: number }> {}

/** The server refused the request (4xx) with its error body; retrying will not help. */
export class ApiRefused extends Data.TaggedError("ApiRefused")<{
  readonly status: number
  readonly error: string
  readonly message: string
  /** With `claim_rejected:slot_busy`: the device's own reservation that holds the slot. */
  readonly holder?: WorkerApi.ErrorBody["holder"]
}> {}

/** A failed call. */
export type ApiError = ApiUnreachable | ApiRefused

/** A Worker API client for one device. */
export interface Client {
  /** The server's base URL. */
  readonly server: string
  /** Reports the device's containment level; answers with the server's fleet. */
  readonly register: (containment: string) => Effect.Effect<z.infer<typeof WorkerApi.Registered>, ApiError>
  /** Claims an assignment for a slot; null when nothing is pending. */
  readonly claim: (slot: number) => Effect.Effect<WorkerApi.AssignmentView | null, ApiError>
  /** Submits progress events (idempotent by sequence). */
  readonly progress: (reservationId: number, fence: number, events: ReadonlyArray<PhaseModel.Event>) => Effect.Effect<z.infer<typeof WorkerApi.ProgressResponse>, ApiError>
  /** Uploads the result; returns the receipt (a resubmission returns the original one). */
  readonly result: (reservationId: number, body: z.infer<typeof WorkerApi.ResultRequest>) => Effect.Effect<z.infer<typeof WorkerApi.Receipt>, ApiError>
  /** Gives an active reservation back; the target returns to pending. */
  readonly release: (reservationId: number, body: z.infer<typeof WorkerApi.ReleaseRequest>) => Effect.Effect<WorkerApi.AssignmentView, ApiError>
  /** Reads one of the device's own assignments. */
  readonly get: (reservationId: number) => Effect.Effect<WorkerApi.AssignmentView, ApiError>
}

/** Client options. */
export interface Options {
  /** Base URL, for example `http://127.0.0.1:8080`. */
  readonly server: string
  /** The device's bearer token. */
  readonly token: string
  /** Per-request timeout, milliseconds (default 10 s). */
  readonly timeoutMs?: number
}

/** The claim deadline sent with a request timeout of `timeoutMs`: a fifth of it (at most 2 s) is left for transit. */
export const claimWaitMs = (timeoutMs: number): number => Math.max(1, Math.min(WorkerApi.maxClaimWaitMs, Math.floor(timeoutMs - Math.min(2000, timeoutMs / 5))))

// 401 is retried too: a token being rotated must not make the outbox give up on events.
const retryable = (status: number) => status >= 500 || status === 408 || status === 429 || status === 401

/**
 * Makes a client.
 *
 * @example
 * const api = Client.make({ server: "http://127.0.0.1:8080", token: process.env.SCANFLEET_TOKEN! })
 * const assignment = yield* api.claim(0)
 */
export const make = (opts: Options): Client => {
  const base = opts.server.replace(/\/+$/, "")
  const call = <S extends z.ZodType>(method: "GET" | "POST", path: string, body: unknown, schema: S): Effect.Effect<z.infer<S>, ApiError> =>
    Effect.gen(function* () {
      // Interrupting the call aborts the request.
      const res = yield* Effect.tryPromise({
        try: (signal) =>
          fetch(`${base}${path}`, {
            method,
            headers: { authorization: `Bearer ${opts.token}`, ...(body !== undefined ? { "content-type": "application/json" } : {}) },
            body: body !== undefined ? JSON.stringify(body) : undefined,
            signal: AbortSignal.any([signal, AbortSignal.timeout(opts.timeoutMs ?? 10_000)])
          }).then(async (r) => ({ ok: r.ok, status: r.status, text: await r.text().catch(() => "") })),
        catch: (e) => new ApiUnreachable({ message: `${method} ${path}: ${String((e as Error).cause ?? (e as Error).message)}` })
      })
      if (!res.ok) {
        if (retryable(res.status)) return yield* new ApiUnreachable({ message: `${method} ${path}: HTTP ${res.status}`, status: res.status })
        const parsed = WorkerApi.ErrorBodySchema.safeParse(safeJson(res.text))
        return yield* new ApiRefused({
          status: res.status,
          error: parsed.success ? parsed.data.error : `http_${res.status}`,
          message: parsed.success ? parsed.data.message : res.text.slice(0, 500),
          ...(parsed.success && parsed.data.holder ? { holder: parsed.data.holder } : {})
        })
      }
      const parsed = schema.safeParse(safeJson(res.text))
      // A body that is not the contract's (a proxy's error page, say): treat it as a transient failure.
      if (!parsed.success) return yield* new ApiUnreachable({ message: `${method} ${path}: response does not match the contract: ${parsed.error.message.slice(0, 300)}` })
      return parsed.data as z.infer<S>
    })
  return {
    server: base,
    register: (containment) => call("POST", "/v1/device/register", { containment }, WorkerApi.Registered),
    // The server commits no claim after waitMs: a claim answered after this client gave up would hold the slot until expiry.
    // The margin covers the time the request takes to reach the server, which the server cannot see.
    claim: (slot) => Effect.map(call("POST", "/v1/assignments/claim", { slot, waitMs: claimWaitMs(opts.timeoutMs ?? 10_000) }, WorkerApi.ClaimResponse), (r) => r.assignment),
    progress: (id, fence, events) => call("POST", `/v1/assignments/${id}/progress`, { fence, events }, WorkerApi.ProgressResponse),
    result: (id, body) => call("POST", `/v1/assignments/${id}/result`, body, WorkerApi.Receipt),
    release: (id, body) => call("POST", `/v1/assignments/${id}/release`, body, WorkerApi.AssignmentViewSchema),
    get: (id) => call("GET", `/v1/assignments/${id}`, undefined, WorkerApi.AssignmentViewSchema)
  }
}

const safeJson = (text: string): unknown => {
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}
