import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

type Row = Record<string, unknown>

/**
 * A deterministic text dump of the Postgres schema in the connection's
 * search_path, built from the catalogs (no pg_dump needed): tables with their
 * columns, then constraints, indexes, table storage options, functions and
 * triggers, each sorted by name.
 */
export const pg = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const [{ schema }] = yield* sql<{ schema: string }>`SELECT current_schema() AS schema`
  const columns = yield* sql<Row>`
    SELECT table_name, column_name, data_type, is_nullable, column_default, is_identity, identity_generation
    FROM information_schema.columns WHERE table_schema = ${schema} ORDER BY table_name, ordinal_position`
  const constraints = yield* sql<Row>`
    SELECT c.conrelid::regclass::text AS table_name, c.conname, pg_get_constraintdef(c.oid) AS def
    FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
    WHERE n.nspname = ${schema} AND c.contype <> 'n' ORDER BY 1, 2`
  const indexes = yield* sql<Row>`SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = ${schema} ORDER BY tablename, indexname`
  const options = yield* sql<Row>`
    SELECT c.relname, array_to_string(c.reloptions, ', ') AS opts
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = ${schema} AND c.relkind = 'r' AND c.reloptions IS NOT NULL ORDER BY 1`
  const functions = yield* sql<Row>`
    SELECT p.proname, pg_get_functiondef(p.oid) AS def
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ${schema} ORDER BY 1`
  const triggers = yield* sql<Row>`
    SELECT pg_get_triggerdef(t.oid) AS def
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = ${schema} AND NOT t.tgisinternal ORDER BY c.relname, t.tgname`
  const strip = (s: string) => s.split(`${schema}.`).join("")
  const tables = new Map<string, Array<string>>()
  for (const c of columns) {
    const type = String(c.data_type)
    const identity = c.is_identity === "YES" ? ` GENERATED ${c.identity_generation} AS IDENTITY` : ""
    const def = c.column_default === null ? "" : ` DEFAULT ${c.column_default}`
    const nullable = c.is_nullable === "NO" ? " NOT NULL" : ""
    const list = tables.get(String(c.table_name)) ?? []
    list.push(`  ${c.column_name} ${type}${identity}${def}${nullable}`)
    tables.set(String(c.table_name), list)
  }
  const out: Array<string> = ["-- Generated from the migrated schema; packages/adapters/test/schema.test.ts checks it.", ""]
  for (const [name, cols] of tables) out.push(`CREATE TABLE ${name} (\n${cols.join(",\n")}\n);`, "")
  for (const c of constraints) out.push(`ALTER TABLE ${strip(String(c.table_name))} ADD CONSTRAINT ${c.conname} ${strip(String(c.def))};`)
  out.push("")
  for (const i of indexes) out.push(`${strip(String(i.indexdef))};`)
  if (options.length > 0) out.push("")
  for (const o of options) out.push(`ALTER TABLE ${o.relname} SET (${o.opts});`)
  for (const f of functions) out.push("", `${strip(String(f.def)).trimEnd()};`)
  if (triggers.length > 0) out.push("")
  for (const t of triggers) out.push(`${strip(String(t.def))};`)
  return out.join("\n") + "\n"
})

/** The SQLite schema as SQLite stores it: every table, then every index, by name. */
export const sqlite = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{ sql: string }>`
    SELECT sql FROM sqlite_master WHERE sql IS NOT NULL
    ORDER BY CASE type WHEN 'table' THEN 0 ELSE 1 END, name`
  const norm = (s: string) => s.split("\n").map((l) => l.trimEnd()).join("\n")
  return ["-- Generated from the migrated schema; packages/adapters/test/schema.test.ts checks it.", "", ...rows.map((r) => `${norm(r.sql)};\n`)].join("\n")
})
