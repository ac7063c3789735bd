import type { Source } from "./Source.js"

/**
 * Validity bounds for remote content-update timestamps.
 *
 * - the text is ISO-8601 with an explicit offset (`Z` or `±hh:mm`); a local time
 *   without offset is ambiguous and is refused;
 * - the instant is not before 2000-01-01T00:00:00Z (no hosting site predates it;
 *   earlier values are epoch-zero placeholders or corrupt);
 * - the instant is not more than `maxSkewMs` after the observation time `now`
 *   (default five minutes: a source clock may run slightly ahead, a value far in
 *   the future would win every `GREATEST` forever and block updates).
 */
export interface Bounds {
  /** Earliest accepted instant, epoch milliseconds. */
  readonly notBefore: number
  /** How far after `now` an instant may lie, milliseconds. */
  readonly maxSkewMs: number
}

/** The documented default bounds. */
export const defaultBounds: Bounds = { notBefore: Date.UTC(2000, 0, 1), maxSkewMs: 5 * 60_000 }

/** The field each source uses for the remote content-update time; DockerHub has none. */
export const fieldOf: Record<Source, string | undefined> = {
  github: "pushed_at",
  gitlab: "last_activity_at",
  huggingface: "lastModified",
  dockerhub: undefined
}

const iso =
  /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?([Zz]|[+-]\d{2}:?\d{2})$/

// Date.UTC reads years 0–99 as 1900–1999; setting the full year avoids that.
const utc = (y: number, mo: number, d: number, h = 0, mi = 0, s = 0, ms = 0): number => {
  const t = new Date(0)
  t.setUTCFullYear(y, mo, d)
  t.setUTCHours(h, mi, s, ms)
  return t.getTime()
}

const daysIn = (y: number, m: number) => new Date(utc(y, m, 0)).getUTCDate()

/**
 * Parses an ISO-8601 instant with an explicit offset into UTC epoch milliseconds,
 * or `undefined` when the text is not one. Never throws.
 */
export const parseInstant = (raw: unknown): number | undefined => {
  if (typeof raw !== "string" || raw.length > 64) return undefined
  const m = iso.exec(raw.trim())
  if (!m) return undefined
  const [, ys, mos, ds, hs, mis, ss, frac, off] = m
  const y = Number(ys), mo = Number(mos), d = Number(ds), h = Number(hs), mi = Number(mis), s = Number(ss ?? "0")
  if (mo < 1 || mo > 12 || d < 1 || d > daysIn(y, mo) || h > 23 || mi > 59 || s > 59) return undefined
  const ms = frac ? Math.floor(Number(`0.${frac}`) * 1000) : 0
  let offsetMin = 0
  if (off !== "Z" && off !== "z") {
    const sign = off[0] === "-" ? -1 : 1
    const digits = off.slice(1).replace(":", "")
    const oh = Number(digits.slice(0, 2)), om = Number(digits.slice(2, 4))
    if (oh > 23 || om > 59) return undefined
    offsetMin = sign * (oh * 60 + om)
  }
  const t = utc(y, mo - 1, d, h, mi, s, ms) - offsetMin * 60_000
  return Number.isFinite(t) ? t : undefined
}

/** The latest instant a JavaScript `Date` holds, epoch milliseconds. */
export const maxDateMs = 8.64e15

/**
 * An instant as an operator writes it in a query string (`since=`, `changedSince=`): epoch
 * milliseconds (decimal digits, at most {@link maxDateMs}), a calendar date (midnight UTC), or an
 * ISO-8601 instant with its offset ({@link parseInstant}); `undefined` for anything else, blanks
 * around it included (`Date.parse` alone takes "March 7", "-1" and "x 1"). Never throws.
 */
export const parseQueryInstant = (raw: string): number | undefined => {
  if (/^\d{1,16}$/.test(raw)) return Number(raw) <= maxDateMs ? Number(raw) : undefined
  if (/^\d{4}-\d{2}-\d{2}$/.test(raw)) return parseInstant(`${raw}T00:00:00Z`)
  return raw.trim() === raw ? parseInstant(raw) : undefined
}

/**
 * Normalises a raw remote timestamp to UTC epoch milliseconds, or `undefined`
 * ("no valid timestamp") when it is missing, malformed or outside the bounds.
 * DockerHub records never carry one. Never throws.
 *
 * @example
 * normalize("github", "2024-05-01T10:00:00+02:00", Date.UTC(2025, 0, 1)) // 1714550400000
 */
export const normalize = (
  source: Source,
  raw: unknown,
  now: number,
  bounds: Bounds = defaultBounds
): number | undefined => {
  if (source === "dockerhub") return undefined
  const t = parseInstant(raw)
  if (t === undefined) return undefined
  if (t < bounds.notBefore || t > now + bounds.maxSkewMs) return undefined
  return t
}

/** Reads a source record's timestamp field and normalises it. */
export const fromRecord = (
  source: Source,
  record: Record<string, unknown>,
  now: number,
  bounds: Bounds = defaultBounds
): number | undefined => {
  const field = fieldOf[source]
  return field === undefined ? undefined : normalize(source, record[field], now, bounds)
}
