import { HttpServerRequest } from "@effect/platform"
import { Store } from "@scanfleet/core"
import { Effect, FiberRef, Option } from "effect"
import { type ApiError, forbidden, fromStoreError, unauthorized } from "./ApiError.js"
import * as Request from "./internal/Request.js"
import { Settings } from "./ServerConfig.js"
import * as Tokens from "./Tokens.js"

/** The cookie the dashboard keeps its session in after `/?token=…`. */
export const adminCookie = "scanfleet_admin"

/**
 * The dashboard cookie's value: derived from the admin token, never the token
 * itself, so a leaked cookie opens the read-only dashboard and not the admin API
 * (which takes only the bearer token).
 */
export const dashboardSession = (adminToken: string): string => Tokens.hash(`scanfleet-dashboard-session:${adminToken}`)

/** Who a request authenticated as: a device, by its id; the admin, by the bearer token (with the actor it names) or the dashboard's session. */
export type Caller = { readonly deviceId: number } | { readonly admin: "token"; readonly actor?: string } | { readonly admin: "dashboard" }

/**
 * The caller of the request this fiber serves, once its credentials are checked (`null` before), for
 * the server's log lines about the request: never a token, only whose it was.
 */
export const caller = FiberRef.unsafeMake<Caller | null>(null)

const bearer = Effect.map(HttpServerRequest.HttpServerRequest, (req) => Tokens.fromAuthorization(req.headers["authorization"]))

const isAdmin = (token: string) => Effect.map(Settings, (s) => Tokens.equal(token, s.adminToken))

/**
 * The device behind the bearer token, found by the token's SHA-256 (so the
 * lookup's timing says nothing about the secret): 401 when missing or unknown (revoked
 * devices included), 403 when the admin token is used on the Worker API.
 */
export const device: Effect.Effect<Store.Device, ApiError, HttpServerRequest.HttpServerRequest | Store.Store | Settings> = Effect.gen(function* () {
  const token = yield* bearer
  if (token === null) return yield* Effect.fail(unauthorized("a device bearer token is required (Authorization: Bearer <token>)"))
  const store = yield* Store.Store
  const hash = Tokens.hash(token)
  const d = yield* store.deviceByTokenHash(hash).pipe(Effect.mapError(fromStoreError))
  if (d !== null) return yield* Effect.as(FiberRef.set(caller, { deviceId: d.id }), d)
  if (yield* isAdmin(token)) return yield* Effect.fail(forbidden("the admin token cannot act as a device; register a device with POST /v1/admin/devices"))
  return yield* Effect.fail(unauthorized("the bearer token matches no registered device (it may have been revoked)"))
})

/**
 * Requires the admin token, as a bearer token or (for the dashboard) the
 * admin cookie: 401 when missing or wrong, 403 when a device token is used.
 */
export const admin = (opts: { readonly cookie: boolean }): Effect.Effect<void, ApiError, HttpServerRequest.HttpServerRequest | Store.Store | Settings> =>
  Effect.gen(function* () {
    const req = yield* HttpServerRequest.HttpServerRequest
    const settings = yield* Settings
    const cookie = opts.cookie ? req.cookies[adminCookie] : undefined
    if (cookie !== undefined && Tokens.equal(cookie, dashboardSession(settings.adminToken))) return yield* FiberRef.set(caller, { admin: "dashboard" })
    const token = yield* bearer
    if (token === null)
      return yield* Effect.fail(unauthorized(cookie === undefined ? "the admin token is required (Authorization: Bearer <admin token>)" : "the dashboard session is no longer valid; open /?token=<admin token> again"))
    if (yield* isAdmin(token)) {
      // the actor as the endpoint would audit it; one it refuses (too long, a control character) is left out
      const actor = yield* Effect.option(Request.actorHeader)
      return yield* FiberRef.set(caller, Option.isSome(actor) ? { admin: "token", actor: actor.value } : { admin: "token" })
    }
    const store = yield* Store.Store
    const d = yield* store.deviceByTokenHash(Tokens.hash(token)).pipe(Effect.mapError(fromStoreError))
    if (d !== null) return yield* Effect.fail(forbidden("a device token cannot use the admin API"))
    return yield* Effect.fail(unauthorized("the admin token is wrong"))
  })
