import type { SqlError } from "@effect/sql"
import { Cause, Effect, Layer, Option } from "effect"
import { Errors } from "@scanfleet/core"

const codeOf = (cause: unknown): string => {
  if (typeof cause !== "object" || cause === null) return ""
  const c = cause as { code?: unknown }
  return typeof c.code === "string" ? c.code : ""
}

/** Classifies a driver error (a pg SQLSTATE or a SQLite result code) as a port error reason. */
export const reasonOf = (cause: unknown): Errors.StoreError["reason"] => {
  const code = codeOf(cause)
  // pg: 23xxx integrity violations; 40001 serialization failure, 40P01 deadlock, 55P03 lock not available
  if (/^23/.test(code) || code.startsWith("SQLITE_CONSTRAINT")) return "constraint"
  if (code === "40001" || code === "40P01" || code === "55P03" || code.startsWith("SQLITE_BUSY") || code.startsWith("SQLITE_LOCKED")) return "conflict"
  if (code.startsWith("XX") || code.startsWith("SQLITE_CORRUPT") || code === "SQLITE_NOTADB") return "corrupt"
  return "unavailable"
}

/** Maps a SqlError to core's StoreError, so the backend's own error never leaves the adapter. */
export const toStoreError = (e: SqlError.SqlError): Errors.StoreError => {
  const detail = e.cause instanceof Error ? `: ${e.cause.message}` : ""
  return new Errors.StoreError({ reason: reasonOf(e.cause), message: `${e.message}${detail}`, cause: e.cause })
}

/** Replaces the SqlError channel of an effect with StoreError. */
export const mapped = <A, E, R>(self: Effect.Effect<A, E | SqlError.SqlError, R>): Effect.Effect<A, Exclude<E, SqlError.SqlError> | Errors.StoreError, R> =>
  Effect.catchIf(
    self,
    (e): e is SqlError.SqlError => typeof e === "object" && e !== null && (e as { _tag?: unknown })._tag === "SqlError",
    (e) => Effect.fail(toStoreError(e))
  ) as Effect.Effect<A, Exclude<E, SqlError.SqlError> | Errors.StoreError, R>

/**
 * A store layer whose construction fails only with StoreError: drivers throw
 * while opening (a missing directory, a refused connection), which would
 * otherwise surface as a defect.
 */
export const storeLayer = <A, R>(layer: Layer.Layer<A, Errors.StoreError, R>): Layer.Layer<A, Errors.StoreError, R> =>
  Layer.catchAllCause(layer, (cause) =>
    Layer.fail(
      Option.getOrElse(Cause.failureOption(cause), () => {
        const squashed = Cause.squash(cause)
        return new Errors.StoreError({ reason: "unavailable", message: `opening the store failed: ${squashed instanceof Error ? squashed.message : String(squashed)}`, cause: squashed })
      })
    )
  )
