import type { z } from "zod"
import { RemoteTimestamp, type Source, WorkerApi } from "@scanfleet/core"
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

/** The longest identity discovery stores, in UTF-8 bytes: far above any real one, and within every index of every backend. */
export const maxIdentityBytes = 1024

const unpairedSurrogate = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/

/**
 * Why an identity cannot be stored exactly as the API sent it, or null when it
 * can. PostgreSQL refuses a NUL byte, both backends replace an unpaired
 * surrogate (so the stored identity would differ from the listed one), and a
 * huge name overflows the unique index: any of these would fail the whole
 * batch, so such a record is set aside as malformed instead. So is a name no
 * source allows and an operator could misread (core's `WorkerApi.labelProblem`).
 */
export const identityProblem = (identity: string): string | null => {
  if (identity === "") return "the identity is empty"
  const why = WorkerApi.labelProblem(identity)
  if (why) return `the identity ${why}`
  if (unpairedSurrogate.test(identity)) return "the identity is not valid Unicode (an unpaired surrogate)"
  const bytes = new TextEncoder().encode(identity).length
  if (bytes > maxIdentityBytes) return `the identity is ${bytes} bytes long; at most ${maxIdentityBytes} are stored`
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
    const problem = identityProblem(d.identity)
    if (problem !== null) {
      malformed.push({ identity: d.identity.slice(0, 200), reason: problem })
      continue
    }
    const remoteAt = RemoteTimestamp.normalize(source, d.rawRemoteAt, now) ?? null
    records.push({ identity: d.identity, remoteAt, rawRemoteAt: d.rawRemoteAt })
  }
  return { records, malformed }
}
