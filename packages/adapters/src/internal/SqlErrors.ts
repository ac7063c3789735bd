import type { SqlError } from "@effect/sql"
import { Cause, Effect, Layer, Option } from "effect"
import { Errors } from "@scanfleet/core"

type Reason = Errors.StoreError["reason"]

export const codeOf = (cause: unknown): string => {
  if (typeof cause !== "object" || cause === null) return ""
  const c = cause as { code?: unknown }
  return typeof c.code === "string" ? c.code : ""
}

/**
 * PostgreSQL SQLSTATEs, by exact code first, then by class (the first two
 * characters). What a client can provoke with its own data (class 22, 54) is
 * `invalid`; what retrying can cure is `conflict` (retried inside the adapter),
 * `unavailable` or `full`.
 */
export const pgCodes: Readonly<Record<string, Reason>> = {
  "40001": "conflict", // serialization_failure
  "40P01": "conflict", // deadlock_detected
  "40002": "constraint", // transaction_integrity_constraint_violation (a deferred constraint at commit)
  "40003": "unavailable", // statement_completion_unknown: the connection was lost around a commit
  "08P01": "invalid", // protocol_violation: a statement the server cannot take as sent (over 65,535 parameters); the connection is fine and a retry fails alike
  "55P03": "conflict", // lock_not_available
  "55006": "conflict", // object_in_use
  "25006": "unavailable", // read_only_sql_transaction: a standby or a read-only server
  "53100": "full", // disk_full
  "53200": "full", // out_of_memory
  "53300": "unavailable", // too_many_connections
  "53400": "full", // configuration_limit_exceeded
  "57014": "unavailable", // query_canceled (statement_timeout): the server is too slow now
  "57P01": "unavailable", // admin_shutdown (pg_terminate_backend)
  "57P02": "unavailable", // crash_shutdown
  "57P03": "unavailable", // cannot_connect_now
  "57P04": "unavailable", // database_dropped
  "57P05": "unavailable", // idle_session_timeout
  "58030": "unavailable", // io_error
  "XX001": "corrupt", // data_corrupted
  "XX002": "corrupt", // index_corrupted
  P0001: "constraint" // raise_exception: a rule of the schema refused the write
}

/** PostgreSQL SQLSTATE classes, for codes not listed one by one. */
export const pgClasses: Readonly<Record<string, Reason>> = {
  "08": "unavailable", // connection_exception
  "22": "invalid", // data_exception: 22021 NUL/encoding, 22001 too long, 22P02 bad text, 22003 out of range, 22P05 untranslatable
  "23": "constraint", // integrity_constraint_violation
  "28": "unavailable", // invalid_authorization_specification: the server refuses these credentials
  "3D": "unavailable", // invalid_catalog_name: the database does not exist
  "40": "conflict", // transaction_rollback
  "53": "full", // insufficient_resources
  "54": "invalid", // program_limit_exceeded: 54000 index row too large, 54001 statement too complex
  "57": "unavailable", // operator_intervention
  "58": "unavailable", // system_error
  XX: "internal" // internal_error
}

/**
 * SQLite primary result codes (an extended code such as `SQLITE_IOERR_WRITE` or
 * `SQLITE_CONSTRAINT_UNIQUE` counts as its primary code).
 */
export const sqliteCodes: Readonly<Record<string, Reason>> = {
  SQLITE_BUSY: "conflict", // another connection holds the lock (BUSY_SNAPSHOT too: the transaction is run again)
  SQLITE_LOCKED: "conflict",
  SQLITE_PROTOCOL: "conflict",
  SQLITE_SCHEMA: "conflict",
  SQLITE_ABORT: "conflict",
  SQLITE_INTERRUPT: "conflict",
  SQLITE_FULL: "full", // database or disk is full
  SQLITE_NOMEM: "full",
  SQLITE_NOLFS: "full",
  SQLITE_IOERR: "unavailable", // the file system failed a read or a write
  SQLITE_CANTOPEN: "unavailable",
  SQLITE_READONLY: "unavailable",
  SQLITE_PERM: "unavailable",
  SQLITE_CONSTRAINT: "constraint",
  SQLITE_TOOBIG: "invalid", // a string or blob over SQLITE_MAX_LENGTH
  SQLITE_MISMATCH: "invalid", // datatype mismatch
  SQLITE_CORRUPT: "corrupt",
  SQLITE_NOTADB: "corrupt",
  SQLITE_FORMAT: "corrupt",
  SQLITE_ERROR: "internal", // SQL error or missing table: the schema is not the one this code expects
  SQLITE_INTERNAL: "internal",
  SQLITE_MISUSE: "internal",
  SQLITE_RANGE: "internal",
  SQLITE_NOTFOUND: "internal",
  SQLITE_EMPTY: "internal",
  SQLITE_AUTH: "internal"
}

// Node's socket errors when the server cannot be reached or drops the connection.
const networkCodes = new Set(["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EPIPE", "ENOTFOUND", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN", "ECONNABORTED"])

/** Classifies a driver error (a pg SQLSTATE, a SQLite result code, a socket error) as a port error reason. */
export const reasonOf = (cause: unknown): Reason => {
  const code = codeOf(cause)
  if (code.startsWith("SQLITE_")) {
    const primary = code.match(/^SQLITE_[A-Z]+/)![0]
    return sqliteCodes[primary] ?? "internal"
  }
  if (/^[0-9A-Z]{5}$/.test(code)) return pgCodes[code] ?? pgClasses[code.slice(0, 2)] ?? "internal"
  if (networkCodes.has(code)) return "unavailable"
  // A driver's own argument checks (a bind value it cannot convert): a defect of the caller.
  if (cause instanceof TypeError || cause instanceof RangeError) return "internal"
  // pg reports a lost connection ("Connection terminated unexpectedly", a timeout) without a code.
  return "unavailable"
}

/**
 * Whether a driver error is a write refused by a read-only database: SQLSTATE 25006 (a PostgreSQL
 * standby, `default_transaction_read_only`) or `SQLITE_READONLY*` (a file or mount without write
 * access). Its reason stays `unavailable`: a failover or a remount may end it.
 */
export const isReadOnly = (cause: unknown): boolean => {
  const code = codeOf(cause)
  return code === "25006" || code.startsWith("SQLITE_READONLY")
}

/** Maps a SqlError to core's StoreError, so the backend's own error never leaves the adapter. */
export const toStoreError = (e: SqlError.SqlError): Errors.StoreError => {
  const detail = e.cause instanceof Error ? `: ${e.cause.message}` : ""
  return new Errors.StoreError({ reason: reasonOf(e.cause), message: `${e.message}${detail}`, cause: e.cause })
}

const isSqlError = (e: unknown): e is SqlError.SqlError => typeof e === "object" && e !== null && (e as { _tag?: unknown })._tag === "SqlError"

/**
 * Replaces the SqlError channel of an effect with StoreError. A failed COMMIT or
 * ROLLBACK, which `@effect/sql` raises as a defect, is mapped the same way: it is
 * the database's answer, not a bug.
 */
export const mapped = <A, E, R>(self: Effect.Effect<A, E | SqlError.SqlError, R>): Effect.Effect<A, Exclude<E, SqlError.SqlError> | Errors.StoreError, R> =>
  Effect.catchIf(self, isSqlError, (e) => Effect.fail(toStoreError(e))).pipe(
    Effect.catchSomeDefect((d) => (isSqlError(d) ? Option.some(Effect.fail(toStoreError(d))) : Option.none()))
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
        const reason = reasonOf(squashed)
        return new Errors.StoreError({ reason: reason === "internal" ? "unavailable" : reason, message: `opening the store failed: ${squashed instanceof Error ? squashed.message : String(squashed)}`, cause: squashed })
      })
    )
  )
