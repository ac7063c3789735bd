import type { SqlClient, SqlError } from "@effect/sql"
import { Effect } from "effect"
import { type Config, Deadline, type Errors, Source } from "@scanfleet/core"
import { mapped } from "./SqlErrors.js"

/**
 * One source's effective policy under a configuration, as a row of `policies` (migration
 * 0012): the document (JSON text) and its deadline offsets from issue time in
 * milliseconds, as core's `Deadline.issue` adds them.
 */
export interface Row {
  readonly source: Source.Source
  readonly policy: string
  readonly scanMs: number
  readonly uploadMs: number
  readonly expiryMs: number
}

/** The offsets of a policy's three deadlines from the issue time: core's `Deadline.issue` at time 0. */
export const offsets = (policy: Config.EffectivePolicy): Pick<Row, "scanMs" | "uploadMs" | "expiryMs"> => {
  const d = Deadline.issue(policy, 0)
  return { scanMs: d.scanDeadline, uploadMs: d.uploadDeadline, expiryMs: d.expiresAt }
}

// Database-independent, so shared by every store of the process.
const rowsCache = new WeakMap<object, Rows>()

/** A configuration's policy rows; see `rowsOf`. */
export interface Rows {
  readonly rows: ReadonlyArray<Row>
  /** Every offset is a whole number of milliseconds (what a statement may add to an issue time in integer arithmetic). */
  readonly exact: boolean
  /** The rows' content as one string: equal for configurations whose policies are equal. */
  readonly key: string
}

/** A configuration's policies, one row per configured source, computed once per configuration object. */
export const rowsOf = (config: Config.ManagedConfig): Rows => {
  let hit = rowsCache.get(config)
  if (hit === undefined) {
    const rows: Array<Row> = []
    for (const source of Source.sources) {
      if (config.sources[source] === undefined) continue
      const { policy } = Deadline.issueFor(config, source, 0)
      rows.push({ source, policy: JSON.stringify(policy), ...offsets(policy) })
    }
    hit = {
      rows,
      exact: rows.every((r) => [r.scanMs, r.uploadMs, r.expiryMs].every(Number.isSafeInteger)),
      key: JSON.stringify(rows.map((r) => [r.source, r.policy, r.scanMs, r.uploadMs, r.expiryMs]))
    }
    rowsCache.set(config, hit)
  }
  return hit
}

/** A configuration's policies as stored: the id of each configured source's row. */
export interface Interned {
  readonly bySource: ReadonlyMap<Source.Source, number>
  /** The ids, one per configured source. */
  readonly ids: ReadonlyArray<number>
}

/** Interns configurations' policies in the database of `sql`; see `make`. */
export type Interner = (config: Config.ManagedConfig) => Effect.Effect<Interned, Errors.StoreError>

// Configurations whose policy ids a store remembers by content (a server reads its configuration
// afresh for each claim, so a new object often holds known policies); policy rows are never
// deleted, so a remembered id stays valid.
const remembered = 64

/** The policy ids a store has interned, by configuration object and by content; only committed ids are put in. */
export interface Cache {
  readonly get: (config: Config.ManagedConfig) => Interned | undefined
  readonly put: (config: Config.ManagedConfig, interned: Interned) => void
}

/** An empty cache of interned policy ids, for one store. */
export const cache = (): Cache => {
  const byObject = new WeakMap<object, Interned>()
  const byContent = new Map<string, Interned>()
  return {
    get: (config) => {
      const hit = byObject.get(config)
      if (hit !== undefined) return hit
      const known = byContent.get(rowsOf(config).key)
      if (known !== undefined) byObject.set(config, known)
      return known
    },
    put: (config, interned) => {
      byObject.set(config, interned)
      const { key } = rowsOf(config)
      if (!byContent.has(key) && byContent.size >= remembered) byContent.delete(byContent.keys().next().value!)
      byContent.set(key, interned)
    }
  }
}

/** The interned form of the ids found for a configuration's rows; dies if one is missing (rows are never deleted). */
export const internedOf = (rows: ReadonlyArray<Row>, found: ReadonlyArray<{ readonly id: unknown; readonly source: unknown }>): Interned => {
  const bySource = new Map(found.map((r) => [r.source as Source.Source, Number(r.id)]))
  if (!rows.every((r) => bySource.has(r.source))) throw new Error("an interned policy row is missing")
  return { bySource, ids: rows.map((r) => bySource.get(r.source)!) }
}

/**
 * The policy ids of a configuration in the database of `sql`, interned once per store and
 * configuration content: its rows are inserted if absent (the unique key on the content makes a
 * concurrent insert of the same policy by another store, in this process or another, wait and
 * then do nothing), then read back in a statement of their own, which sees what a concurrent
 * insert committed. Runs outside any transaction, so the ids it remembers are committed ones.
 */
export const make = (sql: SqlClient.SqlClient, isPg: boolean): Interner => {
  const known = cache()
  return (config) => {
    const hit = known.get(config)
    if (hit !== undefined) return Effect.succeed(hit)
    const { rows } = rowsOf(config)
    return mapped(
      Effect.gen(function* () {
        const found = rows.length === 0 ? [] : isPg ? yield* pg(sql, rows) : yield* sqlite(sql, rows)
        const result = internedOf(rows, found)
        known.put(config, result)
        return result
      })
    )
  }
}
type Found = ReadonlyArray<{ readonly id: unknown; readonly source: unknown }>

const pg = (sql: SqlClient.SqlClient, rows: ReadonlyArray<Row>): Effect.Effect<Found, SqlError.SqlError> => {
  const given = sql`unnest(${rows.map((r) => r.source)}::text[], ${rows.map((r) => r.policy)}::jsonb[], ${rows.map((r) => r.scanMs)}::float8[],
    ${rows.map((r) => r.uploadMs)}::float8[], ${rows.map((r) => r.expiryMs)}::float8[]) AS g(source, policy, scan_ms, upload_ms, expiry_ms)`
  return Effect.zipRight(
    sql`INSERT INTO policies (source, policy, scan_ms, upload_ms, expiry_ms) SELECT * FROM ${given} ORDER BY 1 ON CONFLICT DO NOTHING`,
    sql<{ id: number; source: string }>`SELECT p.id, p.source FROM policies p JOIN ${given} USING (source, policy, scan_ms, upload_ms, expiry_ms)`
  )
}

const sqlite = (sql: SqlClient.SqlClient, rows: ReadonlyArray<Row>): Effect.Effect<Found, SqlError.SqlError> => {
  const given = JSON.stringify(rows.map((r) => [r.source, r.policy, r.scanMs, r.uploadMs, r.expiryMs]))
  return Effect.zipRight(
    // WHERE true: an upsert's SELECT needs a clause before ON CONFLICT
    sql`INSERT INTO policies (source, policy, scan_ms, upload_ms, expiry_ms)
      SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4 FROM json_each(${given}) AS j WHERE true ORDER BY j.key
      ON CONFLICT DO NOTHING`,
    sql<{ id: number; source: string }>`
      SELECT p.id, p.source FROM policies p JOIN json_each(${given}) AS j
        ON p.source = j.value ->> 0 AND p.policy = j.value ->> 1 AND p.scan_ms = j.value ->> 2 AND p.upload_ms = j.value ->> 3 AND p.expiry_ms = j.value ->> 4`
  )
}
