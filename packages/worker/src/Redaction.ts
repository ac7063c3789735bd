import { Findings, FindingsApi } from "@scanfleet/core"
import { createHmac } from "node:crypto"
import * as Client from "./Client.js"
import type * as Scanner from "./Scanner.js"

/**
 * Redaction at the device: before a result leaves the worker, every declared
 * secret field of every finding is replaced by `{ redacted, preview }` (an
 * HMAC-SHA256 fingerprint under the fleet key, and a short preview), and the
 * finding is reported in the shape the server stores as a row. The fleet key
 * comes from the server (`GET /v1/device/fleet-key`, with the device token) or
 * from the device's options; a device that has no key claims no work, so
 * nothing it scans can leave unredacted.
 */

/** The field map of a scanner: its spec's own, else its preset's by name, else none (nothing declared secret). */
export const fieldMapOf = (spec: Scanner.ParsedSpec): Findings.FieldMap => {
  const own = (spec as { readonly findings?: Findings.FieldMap }).findings
  if (own !== undefined) return own
  return Object.hasOwn(Findings.fieldMaps, spec.name) ? Findings.fieldMaps[spec.name as keyof typeof Findings.fieldMaps] : { secretFields: [] }
}

/** The fingerprint of a value under the fleet key. */
export const fingerprint = (fleetKeyHex: string, value: string): string =>
  `${Findings.fingerprintPrefix}${createHmac("sha256", Buffer.from(fleetKeyHex, "hex")).update(value, "utf8").digest("hex")}`

/**
 * The secret in a field's value: the value itself when it is a string; in an
 * object (secretlint's `data`, `{ TOKEN: "…" }`) its longest string, so the
 * same token fingerprints alike whichever scanner reported it; else its
 * canonical JSON.
 */
export const secretValue = (v: unknown): string => {
  if (typeof v === "string") return v
  const strings: Array<string> = []
  const walk = (x: unknown, depth: number) => {
    if (depth > 8) return
    if (typeof x === "string") strings.push(x)
    else if (x !== null && typeof x === "object") for (const y of Object.values(x)) walk(y, depth + 1)
  }
  walk(v, 0)
  return strings.length === 0 ? Findings.canonical(v) : strings.reduce((a, b) => (b.length > a.length ? b : a))
}

// A field cut to the finding schema's length, never between the halves of a surrogate pair (half of one is refused at the edge).
const cutAt = (text: string, max: number) => (text.length <= max ? text : text.slice(0, max).replace(/[\ud800-\udbff]$/, ""))

// Shorter values would also match ordinary words of a log.
const minScrubbed = 6

/** The clear values of a finding's declared secret fields (each string in them, and the field's own secret value), longest first. */
export const clearValues = (scanner: string, map: Findings.FieldMap, finding: Record<string, unknown>): Array<string> => {
  const declared = Findings.declaredFor(scanner, map.secretFields)
  const found = new Set<string>()
  const strings = (x: unknown, depth: number): void => {
    if (depth > 8) return
    if (typeof x === "string") {
      if (x.length >= minScrubbed) found.add(x)
    } else if (x !== null && typeof x === "object") for (const y of Object.values(x)) strings(y, depth + 1)
  }
  const walk = (v: unknown, depth: number): void => {
    if (depth > 32 || v === null || typeof v !== "object") return
    for (const [k, x] of Object.entries(v)) {
      if (declared.has(k) && x !== null && x !== undefined && x !== "") {
        strings(x, 0)
        const text = secretValue(x)
        if (text.length >= minScrubbed) found.add(text)
      } else walk(x, depth + 1)
    }
  }
  walk(finding, 0)
  return [...found].sort((a, b) => b.length - a.length)
}

/**
 * The text with every clear value replaced by its marker
 * `[redacted <fingerprint prefix>]`, so a scanner that also prints a secret
 * elsewhere (its log, a context line of the finding) does not leak it.
 */
export const scrubText = (fleetKeyHex: string, text: string, values: ReadonlyArray<string>): string => {
  let out = text
  for (const v of values) if (out.includes(v)) out = out.split(v).join(`[redacted ${fingerprint(fleetKeyHex, v).slice(0, Findings.fingerprintPrefix.length + 12)}]`)
  return out
}

/** Redaction options. */
export interface Options {
  /** Upload the clear values too, for a server configured with a raw-upload key (default false). */
  readonly rawUpload?: boolean
}

/**
 * Redacts one scanner finding with the fleet key: the declared fields become
 * markers (wherever they sit in the finding), and the reported fields are read
 * with the field map. Pure apart from the HMAC.
 */
export const redact = (fleetKeyHex: string, scanner: string, map: Findings.FieldMap, finding: Record<string, unknown>, opts: Options = {}): Findings.ReportedInput => {
  const declared = Findings.declaredFor(scanner, map.secretFields)
  const raw: Record<string, string> = {}
  const redacted = new Set<string>()
  const clear = clearValues(scanner, map, finding)
  const scrub = (v: unknown, path: string): unknown => {
    if (typeof v === "string") return clear.length === 0 ? v : scrubText(fleetKeyHex, v, clear)
    if (path.split(".").length > 32 || v === null || typeof v !== "object") return v
    if (Array.isArray(v)) return v.map((x, i) => scrub(x, `${path}${i}.`))
    const out: Record<string, unknown> = {}
    for (const [k, x] of Object.entries(v)) {
      if (declared.has(k) && x !== null && x !== undefined && x !== "") {
        const text = Findings.canonical(x)
        out[k] = { redacted: fingerprint(fleetKeyHex, text), preview: Findings.preview(text) } satisfies Findings.Redacted
        redacted.add(k)
        if (opts.rawUpload) raw[`${path}${k}`] = text
      } else out[k] = scrub(x, `${path}${k}.`)
    }
    return out
  }
  const details = scrub(finding, "") as Record<string, unknown>
  const from = (map.fingerprintFrom ?? map.secretFields).map((f) => finding[f]).find((v) => v !== undefined && v !== null && v !== "")
  const detector = cutAt(String(Findings.at(finding, map.detector) ?? scanner), 500)
  const path = cutAt(String(Findings.at(finding, map.path) ?? ""), 2000)
  const lineValue = Number(Findings.at(finding, map.line))
  const line = Number.isSafeInteger(lineValue) && lineValue >= 0 && lineValue <= Findings.maxLine ? lineValue : null
  const commitValue = Findings.at(finding, map.commit)
  const verifiedValue = Findings.at(finding, map.verified)
  // Without a secret value the finding is identified by where it is.
  const secret = from !== undefined ? secretValue(from) : `${detector}\u0000${path}\u0000${line ?? ""}`
  return {
    scanner,
    detector,
    path,
    line,
    commit: typeof commitValue === "string" ? cutAt(commitValue, 200) : null,
    fingerprint: fingerprint(fleetKeyHex, secret),
    preview: from !== undefined ? Findings.preview(secret) : "",
    verified: typeof verifiedValue === "boolean" ? verifiedValue : null,
    secretFields: [...redacted].slice(0, 64),
    details,
    ...(opts.rawUpload && Object.keys(raw).length > 0 ? { raw } : {})
  }
}

/** A device's redactor: the fleet key (fetched once) and its scanner's field map. */
export interface Redactor {
  /** Resolves once the fleet key is known; fails (retryably) while the server cannot be asked. */
  readonly ready: () => Promise<void>
  /** Redacts a result's findings; waits for the fleet key, retrying while the server is unreachable, until `signal` aborts (then it rejects). */
  readonly findings: (fs: ReadonlyArray<Record<string, unknown>>, signal?: AbortSignal) => Promise<Array<Record<string, unknown>>>
  /** Redacts a result: its findings, and in its log every clear value those findings declared secret. Waits for the key as `findings` does. */
  readonly result: (
    staged: { readonly findings: ReadonlyArray<Record<string, unknown>>; readonly log: string },
    signal?: AbortSignal
  ) => Promise<{ readonly findings: Array<Record<string, unknown>>; readonly log: string }>
}

/**
 * Makes a device's redactor.
 *
 * @example
 * const r = Redaction.make({ server, token, scanner: Scanner.trufflehog() })
 * await r.ready()
 */
export const make = (opts: { readonly server: string; readonly token: string; readonly scanner: Scanner.ParsedSpec; readonly fleetKey?: string; readonly rawUpload?: boolean }): Redactor => {
  let key: string | null = opts.fleetKey ?? null
  const map = fieldMapOf(opts.scanner)
  const fetchKey = async () => {
    if (key !== null) return key
    let res: Response
    try {
      res = await fetch(`${opts.server.replace(/\/+$/, "")}/v1/device/fleet-key`, { headers: { authorization: `Bearer ${opts.token}` }, signal: AbortSignal.timeout(10_000) })
    } catch (e) {
      throw new Client.ApiUnreachable({ message: `GET /v1/device/fleet-key: ${(e as Error).message}` })
    }
    const text = await res.text().catch(() => "")
    if (!res.ok) throw new Client.ApiUnreachable({ message: `GET /v1/device/fleet-key: HTTP ${res.status} ${text.slice(0, 200)}`, status: res.status })
    key = FindingsApi.FleetKey.parse(JSON.parse(text)).key
    return key
  }
  // Retries with backoff until the key is known or `signal` aborts: a stopping device is not held
  // open by a timer waiting for a server it can no longer reach.
  const keyEventually = async (signal?: AbortSignal): Promise<string> => {
    for (let wait = 200; ; wait = Math.min(wait * 2, 5000)) {
      signal?.throwIfAborted()
      try {
        return await fetchKey()
      } catch {
        await new Promise<void>((resolve, reject) => {
          const timer = setTimeout(() => (signal?.removeEventListener("abort", stop), resolve()), wait)
          const stop = () => (clearTimeout(timer), reject(signal?.reason))
          signal?.addEventListener("abort", stop, { once: true })
        })
      }
    }
  }
  return {
    ready: async () => {
      await fetchKey()
    },
    findings: async (fs, signal) => {
      const k = await keyEventually(signal)
      return fs.map((f) => redact(k, opts.scanner.name, map, f, { rawUpload: opts.rawUpload ?? false }) as Record<string, unknown>)
    },
    result: async (staged, signal) => {
      const k = await keyEventually(signal)
      const values = [...new Set(staged.findings.flatMap((f) => clearValues(opts.scanner.name, map, f)))].sort((a, b) => b.length - a.length)
      return {
        findings: staged.findings.map((f) => redact(k, opts.scanner.name, map, f, { rawUpload: opts.rawUpload ?? false }) as Record<string, unknown>),
        log: scrubText(k, staged.log, values)
      }
    }
  }
}
