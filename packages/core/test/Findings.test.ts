import { describe, expect, it } from "@effect/vitest"
import { FastCheck as fc } from "effect"
import { Findings, WorkerApi } from "@scanfleet/core"

const secret = "AKIAIOSFODNN7EXAMPLEDEEPSECRET"
const marker = { redacted: `hmac-sha256:${"a".repeat(64)}`, preview: "AKIA…(30)" }

/** A trufflehog finding whose `details` hold `leaf` under `levels` objects (`{ n: { n: … } }`). */
const finding = (levels: number, leaf: Record<string, unknown> = { Raw: secret }) => {
  let details: Record<string, unknown> = leaf
  for (let i = 0; i < levels; i++) details = { n: details }
  return { scanner: "trufflehog", detector: "AWS", path: "x", fingerprint: marker.redacted, preview: marker.preview, details }
}

const rawAt = (levels: number) => ({ path: ["details", ...Array<string>(levels).fill("n"), "Raw"], field: "Raw" })

describe("Findings.unredacted", () => {
  it("a declared secret field in the clear is reported nested 33 and 60 levels deep, as it is at the top of details", () => {
    expect(Findings.unredacted(finding(0))).toEqual([rawAt(0)])
    expect(Findings.unredacted(finding(33))).toEqual([rawAt(33)])
    expect(Findings.unredacted(finding(60))).toEqual([rawAt(60)])
  })

  it("a declared secret at the deepest level a result body may nest is reported", () => {
    // The body is level 1, `findings` 2, the finding 3, `details` 4: the leaf object sits at the body limit.
    const levels = WorkerApi.maxJsonDepth - 4
    const body = { findings: [finding(levels)] }
    let depth = 0
    for (let v: unknown = body; v !== null && typeof v === "object"; v = Array.isArray(v) ? v[0] : "findings" in v ? v.findings : "details" in v ? v.details : (v as { n?: unknown }).n) depth++
    expect(depth).toBe(WorkerApi.maxJsonDepth)
    expect(Findings.unredacted(body.findings[0])).toEqual([rawAt(levels)])
  })

  it("a value nested far past any body limit is still walked whole, without overflowing the stack", () => {
    expect(Findings.unredacted(finding(100_000))).toHaveLength(1)
  })

  it("arrays deep inside details are walked too, and a redaction marker at any depth passes", () => {
    let inner: unknown = { Secret: secret }
    for (let i = 0; i < 50; i++) inner = i % 2 === 0 ? [inner] : { list: inner }
    const path = Findings.unredacted({ ...finding(0, {}), details: { inner } })
    expect(path).toHaveLength(1)
    expect(path[0].field).toBe("Secret")
    expect(path[0].path).toHaveLength(53)
    expect(Findings.unredacted(finding(60, { Raw: marker, RawV2: marker }))).toEqual([])
  })

  it("a value built in memory with a cycle ends", () => {
    const loop: Record<string, unknown> = { Raw: secret }
    loop.self = loop
    expect(Findings.unredacted({ ...finding(0, {}), details: { loop } })).toEqual([{ path: ["details", "loop", "Raw"], field: "Raw" }])
  })

  it("raw and secretFields at the top of a finding are not judged; the same names deeper are", () => {
    expect(Findings.unredacted({ ...finding(0, {}), raw: { Raw: secret }, secretFields: ["Raw"] })).toEqual([])
    expect(Findings.unredacted({ ...finding(0, {}), details: { raw: { Raw: secret } } })).toEqual([{ path: ["details", "raw", "Raw"], field: "Raw" }])
  })

  it.prop("a declared field in the clear is reported whatever its depth, and only it", [fc.array(fc.constantFrom("object", "array"), { maxLength: 300, size: "max" })], ([shape]) => {
    let leaf: unknown = { Match: secret, other: "x" }
    for (const s of shape) leaf = s === "array" ? [leaf] : { k: leaf }
    const found = Findings.unredacted({ ...finding(0, {}), details: { leaf } })
    expect(found).toEqual([{ path: ["details", "leaf", ...[...shape].reverse().map((s) => (s === "array" ? 0 : "k")), "Match"], field: "Match" }])
  })
})

describe("Findings.preview", () => {
  it.prop(
    "a preview shows at most four characters of a secret: every value's preview passes isPreview, and a preview carrying more is refused",
    [fc.string({ unit: "binary", maxLength: 40 }), fc.string({ unit: "grapheme-ascii", minLength: 5, maxLength: 20 })],
    ([value, more]) => {
      const p = Findings.preview(value)
      expect(Findings.isPreview(p)).toBe(true)
      expect(Findings.Preview.safeParse(p).success).toBe(true)
      const chars = [...value]
      expect(p.endsWith(`…(${chars.length})`)).toBe(true)
      expect([...p].length - `…(${chars.length})`.length).toBeLessThanOrEqual(4)
      // Five or more characters before the length, or text in place of the length, is not a preview.
      expect(Findings.isPreview(`${more}…(${chars.length + 12})`)).toBe(false)
      expect(Findings.isPreview(`${p}${more}`)).toBe(false)
    }
  )

  it("shows four characters from 12 up, only the length below, and never a control character or half a surrogate pair", () => {
    expect(Findings.preview("AKIAIOSFODNN7EXAMPLE")).toBe("AKIA…(20)")
    expect(Findings.preview("short-token")).toBe("…(11)")
    expect(Findings.preview("🔑🔑🔑🔑-key-12345")).toBe("🔑🔑🔑🔑…(14)")
    expect(Findings.preview("\u0000AKIAIOSFODNN7")).toBe("…(14)")
    expect(Findings.preview("\ud800AKIAIOSFODNN7")).toBe("…(14)")
    expect(Findings.preview("")).toBe("…(0)")
    for (const bad of ["AKIAIOSFODNN7EXAMPLE", "AKIA…(11)", "AKI…(11)", "AKIA…(012)", "AKIAI…(20)", "🔑🔑🔑🔑🔑…(20)", "\u0000AKI…(20)", "\tAK…(20)", "\ud83d…(20)", "…()", "…(1e3)", "AKIA…(20) ", "…(1234567890)"])
      expect([bad, Findings.isPreview(bad)]).toEqual([bad, false])
    for (const good of ["", "…(0)", "…(5)", "…(40)", "AKIA…(12)", "🔑🔑🔑🔑…(999999999)"]) expect([good, Findings.isPreview(good)]).toEqual([good, true])
  })

  it("a preview of fewer than four characters is taken, as older devices wrote it (they counted UTF-16 units: a secret starting with emoji showed two)", () => {
    for (const older of ["🔑🔑…(20)", "🔑a🔑…(13)", "AKI…(20)", "A…(12)"]) expect([older, Findings.isPreview(older)]).toEqual([older, true])
  })

  it("a redaction marker whose preview breaks the rule is reported as such, not as a value in the clear", () => {
    const marker = { redacted: `hmac-sha256:${"a".repeat(64)}`, preview: "AKIAIOSFODNN7EXAMPLE" }
    expect(Findings.unredacted({ scanner: "gitleaks", Secret: marker })).toEqual([{ path: ["Secret"], field: "Secret", badPreview: true }])
    expect(Findings.unredacted({ scanner: "gitleaks", Secret: "AKIAIOSFODNN7EXAMPLE" })).toEqual([{ path: ["Secret"], field: "Secret" }])
  })
})

/** A stored finding at `path`. */
const storedAt = (path: string, id = 1): Findings.Finding => ({
  id,
  targetId: 1,
  source: "github",
  identity: "o/r",
  detector: "AWS",
  path,
  line: 1,
  fingerprint: marker.redacted,
  preview: marker.preview,
  verified: null,
  status: "new",
  firstSeenAt: 0,
  lastSeenAt: 0,
  firstRevision: null,
  lastRevision: null,
  resolvedAt: null,
  resolvedRevision: null,
  details: {},
  sealed: null
})

const uriOf = (path: string): string => Findings.toSarif([storedAt(path)], { name: "scanfleet", version: "0" }).runs[0].results[0].locations[0].physicalLocation.artifactLocation.uri

const pathOfUri = Findings.pathOfArtifactUri

// RFC 3986, appendix B: a reference's scheme, authority, path, query and fragment.
const parts = (uri: string) => {
  const m = /^(?:([^:/?#]+):)?(?:\/\/([^/?#]*))?([^?#]*)(?:\?([^#]*))?(?:#(.*))?$/.exec(uri)!
  return { scheme: m[1], authority: m[2], path: m[3], query: m[4], fragment: m[5] }
}
// Only unreserved characters, sub-delims, ":", "@", "/" and percent-encoded octets: a path, as RFC 3986 spells one.
const pathChars = /^(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-F]{2})*$/

// Paths built from the pieces that broke the export: separators, dot segments, URI delimiters, escapes, non-ASCII.
const trickyPath = fc
  .array(fc.constantFrom("/", "//", ".", "..", ":", "sha256:", "#", "?", "%", "%zz", "%41", " ", "\t", "\n", "\\", "C:", "[", "]", "|", "{", "}", "ü", "秘密", "😀", "a", ".env"), { maxLength: 12 })
  .map((xs) => xs.join(""))

describe("Findings.toSarif", () => {
  it.prop(
    "property: for any path, the SARIF artifact uri decodes back to exactly that path and never has a scheme, an authority, a query or a fragment",
    [fc.oneof(fc.string({ unit: "binary", maxLength: 60 }), trickyPath)],
    ([path]) => {
      const uri = uriOf(path)
      expect(pathOfUri(uri)).toBe(path)
      expect(parts(uri)).toEqual({ scheme: undefined, authority: undefined, path: uri, query: undefined, fragment: undefined })
      expect(uri).toMatch(pathChars)
      expect(uri).not.toBe("")
    },
    { fastCheck: { numRuns: 2000 } }
  )

  it("paths that are URI syntax stay paths: a scheme-like prefix, a fragment, a query, the root, a leading // and dot segments", () => {
    expect(
      ["dir with space/a.env", "100%.env", "a#frag.env", "q?x=1.env", "sha256:0f3a9b/etc/app.env", "/", "//host/share/x.env", "/etc/app.env", "./a/../b", "", "."].map((p) => [p, uriOf(p)])
    ).toEqual([
      ["dir with space/a.env", "dir%20with%20space/a.env"],
      ["100%.env", "100%25.env"],
      ["a#frag.env", "a%23frag.env"],
      ["q?x=1.env", "q%3Fx%3D1.env"],
      ["sha256:0f3a9b/etc/app.env", "sha256%3A0f3a9b/etc/app.env"],
      ["/", "/"],
      ["//host/share/x.env", "/.//host/share/x.env"],
      ["/etc/app.env", "/etc/app.env"],
      ["./a/../b", "%2E/a/%2E%2E/b"],
      ["", "."],
      [".", "%2E"]
    ])
  })

  it("an unpaired surrogate, which the edge refuses, does not break the export: it becomes U+FFFD", () => {
    expect(uriOf("a\ud800b.env")).toBe("a%EF%BF%BDb.env")
  })
})
