import { z } from "zod"
import type { Source } from "./Source.js"

/**
 * Findings: the rules that hold on both sides of the wire and in every store.
 *
 * A device never sends a secret value in the clear. Each field a scanner
 * declares as secret is replaced by a {@link Redacted} marker: a keyed
 * fingerprint (HMAC-SHA256 under the fleet key, so equal secrets match across
 * devices and rescans without being readable) and a short preview. A result
 * whose findings still carry a declared field unredacted is refused whole.
 *
 * Accepted findings are rows keyed by (target, detector, path, fingerprint);
 * each completed scan of a target is related to the rows its previous scans
 * left open ({@link relate}): new, still present, resolved.
 */

/** The prefix of every fingerprint; the algorithm is named so a later one can sit beside it. */
export const fingerprintPrefix = "hmac-sha256:"

/** A keyed fingerprint: `hmac-sha256:` and 64 lowercase hex digits. */
export const Fingerprint = z.string().regex(/^hmac-sha256:[0-9a-f]{64}$/, "must be hmac-sha256: followed by 64 lowercase hex digits")

/** Longest preview a device may send. */
export const maxPreview = 24

/** How many characters (code points) of a secret its preview shows, and the shortest secret that shows any. */
const previewHead = 4
const previewShowsFrom = 12

const previewShape = /^(?:([\s\S]{1,4})?…\((0|[1-9]\d{0,8})\))?$/u
// A head a preview shows: no control character, no unpaired surrogate (it would not cross the edge).
const showable = /^[^\p{Cc}\p{Cs}]{1,4}$/u

/**
 * True when `text` is a preview as `preview` writes it (or empty, for a finding with no
 * secret value): `…(n)`, or up to four characters then `…(n)` for a value of 12 or more. So a
 * preview never carries more of a secret than four characters, whatever a device sends. Fewer
 * than four are taken too: older devices counted UTF-16 units, so a secret starting with an
 * emoji showed two characters, and showing less gives nothing away.
 */
export const isPreview = (text: string): boolean => {
  if (text.length > maxPreview) return false
  const m = previewShape.exec(text)
  return m !== null && (m[1] === undefined || (showable.test(m[1]) && Number(m[2]) >= previewShowsFrom))
}

/** zod schema of a preview: `isPreview`'s rule. */
export const Preview = z
  .string()
  .max(maxPreview)
  .refine(isPreview, "must be a preview as Findings.preview writes it: …(length), or up to four characters then …(length) for a value of 12 or more")

/** What stands in for a secret value: its fingerprint and a short preview, never the value. */
export const Redacted = z.object({ redacted: Fingerprint, preview: Preview }).strict()
/** A redaction marker. */
export type Redacted = z.infer<typeof Redacted>

/**
 * The fields of each preset scanner's output that hold secret values, keyed by
 * preset name. trufflehog prints the match as `Raw` and `RawV2`; gitleaks as
 * `Secret` and `Match` (the whole matched text); secretlint puts the value in
 * its `message`, in `data` and, in its JSON result, in the file's `sourceContent`.
 */
export const secretFields = {
  trufflehog: ["Raw", "RawV2"],
  gitleaks: ["Secret", "Match"],
  secretlint: ["message", "data", "sourceContent"]
} as const satisfies Record<string, ReadonlyArray<string>>

/**
 * Field names refused unredacted whatever scanner a finding names: trufflehog's
 * and gitleaks' (distinctive enough that no other scanner means anything else
 * by them). secretlint's generic names are checked on findings of `secretlint`.
 */
export const alwaysSecret: ReadonlySet<string> = new Set([...secretFields.trufflehog, ...secretFields.gitleaks])

/** The fields declared secret for a finding of this scanner: its preset's, the always-secret ones and the finding's own. */
export const declaredFor = (scanner: string | undefined, own: ReadonlyArray<string> = []): ReadonlySet<string> =>
  new Set([...alwaysSecret, ...(scanner !== undefined && Object.hasOwn(secretFields, scanner) ? secretFields[scanner as keyof typeof secretFields] : []), ...own])

/**
 * A short preview of a secret: its first four characters and its length (in
 * code points), so an operator can tell an AWS key from a Slack token without
 * learning either. Values under 12 characters, and values whose first four
 * hold a control character or an unpaired surrogate, show only their length.
 */
export const preview = (value: string): string => {
  const chars = [...value]
  const head = chars.slice(0, previewHead).join("")
  return chars.length >= previewShowsFrom && showable.test(head) ? `${head}…(${chars.length})` : `…(${chars.length})`
}

/** The longest identifier-like strings a finding carries. */
const label = z.string().min(1).max(500)

/** The largest line number a finding carries (a 32-bit integer, as the stores keep it); a device reports a larger one as no line. */
export const maxLine = 2_147_483_647

/**
 * One finding as a device reports it: where it is, which detector found it,
 * the fingerprint that identifies the secret, and the scanner's own fields
 * (`details`) with every declared secret field redacted. `raw` holds values in
 * the clear and is accepted only when the server has a raw-upload key, which
 * seals it before anything is stored.
 */
export const Reported = z
  .object({
    /** The scanner (a preset name, or the command scanner's own name). */
    scanner: label,
    detector: label,
    /** Path of the file (or layer, or artifact) inside the target. */
    path: z.string().max(2000),
    line: z.number().int().min(0).max(maxLine).nullable().default(null),
    /** The revision (commit) the scanner saw the finding in, when it says. */
    commit: z.string().max(200).nullable().default(null),
    fingerprint: Fingerprint,
    preview: Preview,
    /** Whether the scanner verified the secret live; null when it does not say. */
    verified: z.boolean().nullable().default(null),
    /** The fields the device redacted (its scanner's declaration). */
    secretFields: z.array(z.string().max(200)).max(64).default([]),
    details: z.record(z.string(), z.unknown()).default({}),
    raw: z.record(z.string(), z.string().max(65_536)).optional()
  })
  .strict()
/** A reported finding as parsed. */
export type Reported = z.infer<typeof Reported>
/** A reported finding as a device writes it. */
export type ReportedInput = z.input<typeof Reported>

/** One declared secret field found with its value in the clear. */
export interface Unredacted {
  readonly path: ReadonlyArray<string | number>
  readonly field: string
  /** Set when the value is a redaction marker whose preview breaks `isPreview` (so it is not taken as redacted). */
  readonly badPreview?: true
}

const isRedacted = (v: unknown) => Redacted.safeParse(v).success

// A redaction marker in every way but its preview.
const markerWithBadPreview = (v: unknown) =>
  typeof v === "object" && v !== null && Redacted.omit({ preview: true }).extend({ preview: z.string() }).safeParse(v).success && !isRedacted(v)

/** One place in a value being checked: its key in its parent, and the parent (a path built only when reported). */
interface Step {
  readonly parent: Step | undefined
  readonly key: string | number
  readonly value: unknown
}

const pathOf = (s: Step): ReadonlyArray<string | number> => {
  const p: Array<string | number> = []
  for (let c: Step | undefined = s; c !== undefined; c = c.parent) p.push(c.key)
  return p.reverse()
}

/**
 * Every place in a finding (any depth) where a declared secret field holds
 * something other than a redaction marker ({@link declaredFor} the scanner
 * the finding names and its own `secretFields`); `raw` is the opt-in clear
 * channel and is judged by the server's raw-upload setting instead.
 */
export const unredacted = (finding: unknown): ReadonlyArray<Unredacted> => {
  const o = finding !== null && typeof finding === "object" ? (finding as { secretFields?: unknown; scanner?: unknown }) : {}
  const own = Array.isArray(o.secretFields) ? (o.secretFields.filter((f) => typeof f === "string") as ReadonlyArray<string>) : []
  const declared = declaredFor(typeof o.scanner === "string" ? o.scanner : undefined, own)
  const out: Array<Unredacted> = []
  // The whole value, with no depth bound: a level the check cannot see is a level
  // where a secret is stored in the clear. An explicit stack rather than recursion,
  // so no depth overflows the call stack; `seen` ends a cycle or a shared object
  // (JSON never makes one, a value built in memory may).
  const stack: Array<Step> = []
  const seen = new WeakSet<object>()
  const enter = (v: unknown, at: Step | undefined) => {
    if (v === null || typeof v !== "object" || seen.has(v)) return
    seen.add(v)
    const next: Array<Step> = Array.isArray(v)
      ? v.map((x, i) => ({ parent: at, key: i, value: x }))
      : Object.entries(v)
          .filter(([k]) => at !== undefined || (k !== "raw" && k !== "secretFields"))
          .map(([k, x]) => ({ parent: at, key: k, value: x }))
    // Reversed onto the stack, so places are reported in document order.
    for (let i = next.length - 1; i >= 0; i--) stack.push(next[i])
  }
  enter(finding, undefined)
  for (let s = stack.pop(); s !== undefined; s = stack.pop()) {
    if (isRedacted(s.value)) continue
    const x = s.value
    if (typeof s.key === "string" && declared.has(s.key) && x !== null && x !== undefined && x !== "")
      out.push(markerWithBadPreview(x) ? { path: pathOf(s), field: s.key, badPreview: true } : { path: pathOf(s), field: s.key })
    else enter(x, s)
  }
  return out
}

/** Row statuses: `new` appeared in the target's latest scan, `open` was there before too, `resolved` is gone. */
export const statuses = ["new", "open", "resolved"] as const
/** A finding's status. */
export type Status = (typeof statuses)[number]

/** A stored finding. Times are epoch milliseconds; revisions are what the scan covered. */
export interface Finding {
  readonly id: number
  readonly targetId: number
  readonly source: Source
  readonly identity: string
  readonly detector: string
  readonly path: string
  readonly line: number | null
  readonly fingerprint: string
  readonly preview: string
  readonly verified: boolean | null
  readonly status: Status
  readonly firstSeenAt: number
  readonly lastSeenAt: number
  readonly firstRevision: string | null
  readonly lastRevision: string | null
  readonly resolvedAt: number | null
  readonly resolvedRevision: string | null
  /** The scanner's fields, every declared secret redacted. */
  readonly details: Readonly<Record<string, unknown>>
  /** The clear values sealed with the server's raw-upload key (opt-in), never the key. */
  readonly sealed: string | null
}

/** How one scan relates to the previous ones of its target. */
export interface Summary {
  readonly new: number
  readonly present: number
  readonly resolved: number
}

/** One accepted scan of a target and its summary. */
export interface Scan extends Summary {
  readonly reservationId: number
  readonly targetId: number
  readonly source: Source
  readonly identity: string
  readonly revision: string | null
  readonly at: number
}

/** One change in a finding's life. */
export interface Event {
  readonly findingId: number
  readonly reservationId: number
  readonly kind: "new" | "reopened" | "resolved"
  readonly revision: string | null
  readonly at: number
}

/** The identity of a finding inside its target: the same secret from the same detector in the same file. */
export const keyOf = (f: { readonly detector: string; readonly path: string; readonly fingerprint: string }): string =>
  `${f.detector}\u0000${f.path}\u0000${f.fingerprint}`

/** Outcomes whose scan says what the target holds now: only these relate findings (a failed scan resolves nothing). */
export const relates = (outcome: string): boolean => outcome === "clean" || outcome === "findings"

/** The revision a scan covers: the commit its findings name when they agree on one, else the covered remote time. */
export const revisionOf = (reported: ReadonlyArray<Accepted>, coveredRemoteAt: number | null): string | null => {
  const commits = new Set(reported.map((r) => r.commit).filter((c): c is string => c !== null))
  if (commits.size === 1) return [...commits][0]
  return coveredRemoteAt === null ? null : new Date(coveredRemoteAt).toISOString()
}

/** What relating one scan asks a store to write. */
export interface Plan {
  /** Findings seen for the first time (one per key). */
  readonly inserts: ReadonlyArray<Accepted>
  /** Known findings seen again: the row's id, its next status, and what this scan says of it. */
  readonly seen: ReadonlyArray<{ readonly id: number; readonly status: "new" | "open"; readonly reopened: boolean; readonly reported: Accepted }>
  /** Rows open before and absent now. */
  readonly resolved: ReadonlyArray<number>
  readonly summary: Summary
}

/**
 * Relates one completed scan to the target's stored findings. A key seen again
 * is still present (a resolved one that comes back is reopened and counts as
 * new); an open key not seen is resolved; a key reported twice in one scan is
 * one finding. Every store writes exactly this plan.
 */
export const relate = (stored: ReadonlyArray<Pick<Finding, "id" | "detector" | "path" | "fingerprint" | "status">>, reported: ReadonlyArray<Accepted>): Plan => {
  const byKey = new Map(stored.map((f) => [keyOf(f), f]))
  const now = new Map<string, Accepted>()
  for (const r of reported) if (!now.has(keyOf(r))) now.set(keyOf(r), r)
  const inserts: Array<Accepted> = []
  const seen: Array<Plan["seen"][number]> = []
  let fresh = 0
  let present = 0
  for (const [k, r] of now) {
    const f = byKey.get(k)
    if (f === undefined) {
      inserts.push(r)
      fresh++
    } else if (f.status === "resolved") {
      seen.push({ id: f.id, status: "new", reopened: true, reported: r })
      fresh++
    } else {
      seen.push({ id: f.id, status: "open", reopened: false, reported: r })
      present++
    }
  }
  const resolved = stored.filter((f) => f.status !== "resolved" && !now.has(keyOf(f))).map((f) => f.id)
  return { inserts, seen, resolved, summary: { new: fresh, present, resolved: resolved.length } }
}

/**
 * A plan that touches no finding: the target had none open and the scan found
 * none. Such a scan writes nothing (its summary reads as zeros), so the common
 * clean result stays off the findings tables.
 */
export const isEmpty = (p: Plan): boolean => p.inserts.length === 0 && p.seen.length === 0 && p.resolved.length === 0

/**
 * Whether accepting this result may write findings whatever the target holds:
 * a relating outcome with findings in the body. A store's one-statement path
 * that does not write findings must leave such a result (and any result for a
 * target with open findings) to the path that does.
 */
export const carriesFindings = (outcome: string, body: string): boolean => relates(outcome) && fromBody(body).length > 0

/** A finding list query. `after` is the keyset cursor: the id of the last row of the previous page. */
export interface ListQuery {
  readonly source?: Source
  readonly identity?: string
  readonly detector?: string
  readonly status?: Status
  readonly verified?: boolean
  /** Only findings seen at or after this time. */
  readonly since?: number
  readonly after?: number
  readonly limit: number
}

/** Whether a finding passes a list query's filters (the cursor and limit aside). */
export const matches = (f: Finding, q: ListQuery): boolean =>
  (q.source === undefined || f.source === q.source) &&
  (q.identity === undefined || f.identity === q.identity) &&
  (q.detector === undefined || f.detector === q.detector) &&
  (q.status === undefined || f.status === q.status) &&
  (q.verified === undefined || f.verified === q.verified) &&
  (q.since === undefined || f.lastSeenAt >= q.since)

/** One page of findings, in id order, and the cursor of the next page (null on the last). */
export interface Page {
  readonly findings: ReadonlyArray<Finding>
  readonly next: number | null
}

/** One delivery of the outbox: what a scan changed, in acceptance order per target. */
export interface OutboxEvent {
  /** Position in the outbox: strictly increasing in commit order per target. */
  readonly seq: number
  readonly type: "scan.related"
  readonly at: number
  readonly scan: Scan
  /** The findings the scan made new or resolved. */
  readonly findings: ReadonlyArray<{ readonly id: number; readonly change: "new" | "resolved"; readonly detector: string; readonly path: string; readonly line: number | null; readonly fingerprint: string; readonly preview: string; readonly verified: boolean | null }>
}

/** A finding without its sealed values: what every reader outside the server's raw key sees. */
export const view = (f: Finding) => {
  const { sealed, ...rest } = f
  return { ...rest, sealed: sealed !== null }
}

/** One JSON line per finding, secrets redacted, sealed values left out. */
export const toJsonLines = (fs: ReadonlyArray<Finding>): string => fs.map((f) => `${JSON.stringify(view(f))}\n`).join("")

const sarifLevel = (f: Finding) => (f.verified === true ? "error" : "warning")

/**
 * A finding's path as a SARIF `artifactLocation.uri`: a relative reference that is
 * never more than a path and gives the path back. Each `/`-separated segment is
 * percent-encoded (`encodeURIComponent`: `:` `?` `#` `%`, spaces, controls and
 * non-ASCII), and so is a segment that is `.` or `..`, so no segment reads as a dot
 * segment; a uri that would start with `//` (an authority) gets the RFC 3986 `/.`
 * prefix. The empty path (no file) is `.`, since code scanning refuses an empty uri.
 * Decoding (`.` is the empty path; else drop a leading `/.` before `//`, then
 * `decodeURIComponent` each segment) gives back the path exactly. An unpaired
 * surrogate, which no stored path holds (the edge refuses it), becomes U+FFFD.
 */
export const artifactUri = (path: string): string => {
  if (path === "") return "."
  const uri = path
    .replace(/\p{Cs}/gu, "\uFFFD")
    .split("/")
    .map((segment) => (segment === "." || segment === ".." ? segment.replaceAll(".", "%2E") : encodeURIComponent(segment)))
    .join("/")
  return uri.startsWith("//") ? `/.${uri}` : uri
}

/** The path an `artifactUri` was made from: `.` is the empty path; else a leading `/.` before `//` goes, then each segment is decoded. */
export const pathOfArtifactUri = (uri: string): string =>
  uri === "."
    ? ""
    : (uri.startsWith("/.//") ? uri.slice(2) : uri)
        .split("/")
        .map((segment) => decodeURIComponent(segment))
        .join("/")

/** The tool a SARIF log names. */
export interface SarifTool {
  readonly name: string
  readonly version: string
  readonly informationUri?: string
}

/** The `$schema` and `version` a SARIF 2.1.0 log starts with. */
export const sarifHead = { $schema: "https://json.schemastore.org/sarif-2.1.0.json", version: "2.1.0" as const }

/** A SARIF run's tool: its driver with one rule per detector, in the order given (a result's `ruleIndex` is a position in it). */
export const sarifTool = (tool: SarifTool, detectors: ReadonlyArray<string>) => ({
  driver: {
    name: tool.name,
    version: tool.version,
    ...(tool.informationUri ? { informationUri: tool.informationUri } : {}),
    rules: detectors.map((d) => ({ id: d, name: d, shortDescription: { text: `secret found by ${d}` } }))
  }
})

/**
 * One finding as a SARIF result: its location and its fingerprint as a partial fingerprint
 * (so code-scanning tools deduplicate as scanfleet does). Resolved findings carry
 * `baselineState: "absent"`, new ones `"new"`, open ones `"unchanged"`.
 */
export const sarifResult = (f: Finding, ruleIndex: number) => ({
  ruleId: f.detector,
  ruleIndex,
  level: sarifLevel(f),
  kind: "fail" as const,
  baselineState: f.status === "resolved" ? ("absent" as const) : f.status === "new" ? ("new" as const) : ("unchanged" as const),
  message: { text: `${f.detector} secret ${f.preview} in ${f.source}:${f.identity}${f.path ? ` at ${f.path}` : ""}${f.verified === true ? " (verified)" : ""}` },
  locations: [
    {
      physicalLocation: {
        artifactLocation: { uri: artifactUri(f.path) },
        ...(f.line !== null && f.line >= 1 ? { region: { startLine: f.line } } : {})
      }
    }
  ],
  partialFingerprints: { "scanfleet/v1": f.fingerprint },
  properties: { findingId: f.id, source: f.source, identity: f.identity, status: f.status, firstSeenAt: new Date(f.firstSeenAt).toISOString(), lastSeenAt: new Date(f.lastSeenAt).toISOString(), firstRevision: f.firstRevision, lastRevision: f.lastRevision }
})

/**
 * A SARIF 2.1.0 log of findings: one run, one rule per detector in the order the
 * detectors first appear, one result per finding (`sarifResult`). The server's export
 * writes the same log a page at a time.
 */
export const toSarif = (fs: ReadonlyArray<Finding>, tool: SarifTool) => {
  const index = new Map<string, number>()
  for (const f of fs) if (!index.has(f.detector)) index.set(f.detector, index.size)
  return { ...sarifHead, runs: [{ tool: sarifTool(tool, [...index.keys()]), results: fs.map((f) => sarifResult(f, index.get(f.detector)!)) }] }
}

/** A finding as the server stores it in a result body: the reported fields, the clear values sealed (or none). */
export const Accepted = Reported.omit({ raw: true }).extend({ sealed: z.string().max(200_000).nullable().default(null) }).strict()
/** An accepted finding. */
export type Accepted = z.infer<typeof Accepted>

/**
 * The findings of a stored result body (`{ findings: [...] }`) that are in the
 * accepted shape; anything else in the body (a log, or findings written by a
 * caller that bypassed the server's intake) becomes no row.
 */
export const fromBody = (body: string): ReadonlyArray<Accepted> => {
  let doc: unknown
  try {
    doc = JSON.parse(body)
  } catch {
    return []
  }
  const list = doc !== null && typeof doc === "object" ? (doc as { findings?: unknown }).findings : undefined
  if (!Array.isArray(list)) return []
  const out: Array<Accepted> = []
  for (const f of list) {
    const p = Accepted.safeParse(f)
    if (p.success) out.push(p.data)
  }
  return out
}

/** A dotted path into a scanner's JSON finding (`SourceMetadata.Data.Git.file`), or several tried in order. */
const FieldPath = z.union([z.string().min(1).max(500), z.array(z.string().min(1).max(500)).min(1).max(16)])

/**
 * How to read a scanner's findings: which fields hold secrets (redacted at the
 * device), which one the fingerprint is taken from (the first present of
 * `fingerprintFrom`, default `secretFields` in order), and where the detector,
 * file, line, commit and verified flag are. A command scanner spec may carry
 * its own; the presets' are in {@link fieldMaps}.
 */
export const FieldMapSchema = z
  .object({
    secretFields: z.array(z.string().min(1).max(200)).max(64),
    fingerprintFrom: z.array(z.string().min(1).max(200)).max(64).optional(),
    detector: FieldPath.optional(),
    path: FieldPath.optional(),
    line: FieldPath.optional(),
    commit: FieldPath.optional(),
    verified: FieldPath.optional()
  })
  .strict()
/** A field map. */
export type FieldMap = z.infer<typeof FieldMapSchema>

/** The field maps of the preset scanners, keyed by preset name (their secret fields are {@link secretFields}). */
export const fieldMaps: Readonly<Record<keyof typeof secretFields, FieldMap>> = {
  trufflehog: {
    secretFields: [...secretFields.trufflehog],
    fingerprintFrom: ["RawV2", "Raw"],
    detector: "DetectorName",
    path: ["SourceMetadata.Data.Git.file", "SourceMetadata.Data.Filesystem.file", "SourceMetadata.Data.Docker.file", "SourceMetadata.Data.Huggingface.file"],
    line: ["SourceMetadata.Data.Git.line", "SourceMetadata.Data.Filesystem.line"],
    commit: ["SourceMetadata.Data.Git.commit", "SourceMetadata.Data.Huggingface.commit"],
    verified: "Verified"
  },
  gitleaks: { secretFields: [...secretFields.gitleaks], fingerprintFrom: ["Secret", "Match"], detector: "RuleID", path: "File", line: "StartLine", commit: "Commit" },
  secretlint: { secretFields: [...secretFields.secretlint], fingerprintFrom: ["data", "message"], detector: "ruleId", path: "filePath", line: "loc.start.line" }
}

/** The value at a dotted path (the first path that yields one), or undefined. */
export const at = (value: unknown, path: FieldMap["detector"]): unknown => {
  if (path === undefined) return undefined
  for (const p of typeof path === "string" ? [path] : path) {
    let v: unknown = value
    for (const k of p.split(".")) v = v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>)[k] : undefined
    if (v !== undefined && v !== null) return v
  }
  return undefined
}

/** A JSON value as one string, keys sorted, so equal values fingerprint equally wherever they were printed. */
export const canonical = (v: unknown): string => (typeof v === "string" ? v : json(v))

const json = (v: unknown): string =>
  v === null || typeof v !== "object"
    ? (JSON.stringify(v) ?? "null")
    : Array.isArray(v)
      ? `[${v.map(json).join(",")}]`
      : `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${json((v as Record<string, unknown>)[k])}`).join(",")}}`

/**
 * The schemas that share their name with a type, under a second name: the
 * bundled `.d.ts` keeps only the type of such a pair, so code built against
 * the published packages refers to the schema by this one.
 */
export const RedactedSchema = Redacted
/** See `RedactedSchema`. */
export const ReportedSchema = Reported
/** See `RedactedSchema`. */
export const AcceptedSchema = Accepted
