import { Either } from "effect"
import { copyFileSync, existsSync, renameSync } from "node:fs"
import type { z } from "zod"

/**
 * What the device does with a file of its own that holds something it did
 * not write (a disk fault, a cut write, a hand edit): the file is set aside
 * beside itself, named by when (`FILE.damaged-<ISO time>`), for a person to
 * inspect; it is never deleted and never written over. What is wrong is said
 * in words that never quote the content: a state row may hold a secret.
 */

/** The name a damaged file is set aside under: never one already taken. */
const asideName = (file: string, at: Date): string => {
  const base = `${file}.damaged-${at.toISOString()}`
  let name = base
  for (let n = 1; existsSync(name); n++) name = `${base}-${n}`
  return name
}

/**
 * Renames a damaged file aside, with its companions (suffixes such as SQLite's
 * `-wal`, which belong to it and not to the fresh file that takes its place)
 * under the same name; returns that name.
 */
export const setAside = (file: string, at: Date, companions: ReadonlyArray<string> = []): string => {
  const aside = asideName(file, at)
  renameSync(file, aside)
  for (const suffix of companions) if (existsSync(`${file}${suffix}`)) renameSync(`${file}${suffix}`, `${aside}${suffix}`)
  return aside
}

/** Copies a damaged file aside, for a file whose inode must stay where it is (a lock others may hold); returns the copy's name. */
export const copyAside = (file: string, at: Date): string => {
  const aside = asideName(file, at)
  copyFileSync(file, aside)
  return aside
}

/** What a schema found wrong with a value: each issue's path and code, never the value. */
export const issues = (e: z.ZodError): string =>
  e.issues
    .map((i) => `${i.path.join(".") || "(the whole value)"}: ${i.code}`)
    .join("; ")
    .slice(0, 300)

/** A value checked with `schema`, or what is wrong with it (see `issues`). */
export const check = <S extends z.ZodType>(schema: S, value: unknown): Either.Either<z.output<S>, string> => {
  const r = schema.safeParse(value)
  return r.success ? Either.right(r.data) : Either.left(issues(r.error))
}

/** Text parsed as JSON and checked with `schema`, or what is wrong with it. JSON.parse's own words quote the text, so they are not used. */
export const decode = <S extends z.ZodType>(schema: S, text: unknown): Either.Either<z.output<S>, string> => {
  if (typeof text !== "string") return Either.left(`not text but ${text === null ? "null" : typeof text}`)
  try {
    return check(schema, JSON.parse(text))
  } catch {
    return Either.left(`not JSON (${text.length} characters)`)
  }
}

/** SQLite's codes for a file that is not a database, or a damaged one. */
const damageCode = /^SQLITE_(NOTADB|CORRUPT)/

/** SQLite's code and words when an error (or one of its causes) says a file is damaged, else null. */
export const sqliteDamage = (e: unknown, depth = 0): { readonly code: string; readonly message: string } | null => {
  if (e === null || typeof e !== "object" || depth > 5) return null
  const { code, message } = e as { code?: unknown; message?: unknown }
  if (typeof code === "string" && damageCode.test(code)) return { code, message: typeof message === "string" ? message : code }
  return sqliteDamage((e as { cause?: unknown }).cause, depth + 1)
}
