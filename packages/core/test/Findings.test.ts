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
    for (const bad of ["AKIAIOSFODNN7EXAMPLE", "AKIA…(11)", "AKIA…(012)", "AKI…(20)", "\u0000AKI…(20)", "…()", "…(1e3)", "AKIA…(20) ", "…(1234567890)"])
      expect([bad, Findings.isPreview(bad)]).toEqual([bad, false])
    for (const good of ["", "…(0)", "…(5)", "…(40)", "AKIA…(12)", "🔑🔑🔑🔑…(999999999)"]) expect([good, Findings.isPreview(good)]).toEqual([good, true])
  })
})
