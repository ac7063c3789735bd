import type { z } from "zod"
import { RemoteTimestamp, type Source } from "@scanfleet/core"
import type { MalformedRecord, SourceRecord } from "./SourceClient.js"
import { describeIssues } from "./SourceHttp.js"

/** The best identity a record that failed its schema offers, for the log line. */
export const guessIdentity = (raw: unknown, fields: ReadonlyArray<string>): string | null => {
  if (typeof raw !== "object" || raw === null) return null
  const r = raw as Record<string, unknown>
  for (const f of fields) {
    const v = r[f]
    if ((typeof v === "string" && v.length > 0) || typeof v === "number") return String(v).slice(0, 200)
  }
  return null
}

/**
 * Reads the records of one page: each is parsed with its schema on its own,
 * so a malformed record is set aside with its identity and never fails the
 * page. The remote timestamp is normalised by core's rule; an invalid one
 * leaves the record admissible with no timestamp.
 */
export const read = <S extends z.ZodType>(
  source: Source.Source,
  items: ReadonlyArray<unknown>,
  schema: S,
  describe: (r: z.infer<S>) => { readonly identity: string; readonly rawRemoteAt: unknown } | { readonly malformed: string },
  identityFields: ReadonlyArray<string>,
  now: number
): { readonly records: Array<SourceRecord>; readonly malformed: Array<MalformedRecord> } => {
  const records: Array<SourceRecord> = []
  const malformed: Array<MalformedRecord> = []
  for (const raw of items) {
    const parsed = schema.safeParse(raw)
    if (!parsed.success) {
      malformed.push({ identity: guessIdentity(raw, identityFields), reason: describeIssues(parsed.error.issues) })
      continue
    }
    const d = describe(parsed.data)
    if ("malformed" in d) {
      malformed.push({ identity: guessIdentity(raw, identityFields), reason: d.malformed })
      continue
    }
    const remoteAt = RemoteTimestamp.normalize(source, d.rawRemoteAt, now) ?? null
    records.push({ identity: d.identity, remoteAt, rawRemoteAt: d.rawRemoteAt })
  }
  return { records, malformed }
}
