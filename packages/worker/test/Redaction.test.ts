import { readdirSync, readFileSync } from "node:fs"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { Findings, WorkerApi } from "@scanfleet/core"
import { describe, expect, it } from "@effect/vitest"
import * as fc from "effect/FastCheck"
import * as Redaction from "../src/Redaction.js"
import * as Scanner from "../src/Scanner.js"
import * as Supervisor from "../src/Supervisor.js"
import * as Fleet from "./support/Fleet.js"

const key = "ab".repeat(32)
const truffle = (secret: string) => ({ DetectorName: "AWS", Raw: secret, RawV2: `${secret}/x`, SourceMetadata: { Data: { Git: { file: "a.env", line: 3, commit: "c1" } } }, Verified: true })

describe("redaction at the device", () => {
  it.prop("a redacted finding holds no declared secret value, and the server's check finds nothing left to refuse", [fc.stringMatching(/^[A-Za-z0-9+/]{12,48}$/)], ([secret]) => {
    for (const [name, raw] of [
      ["trufflehog", truffle(secret)],
      ["gitleaks", { RuleID: "r", Secret: secret, Match: `k=${secret}`, File: "f", StartLine: 1 }],
      ["secretlint", { ruleId: "r", message: `found ${secret}`, data: { TOKEN: secret }, filePath: "f", loc: { start: { line: 2 } } }]
    ] as const) {
      const r = Redaction.redact(key, name, Findings.fieldMaps[name], raw)
      expect(JSON.stringify(r).includes(secret)).toBe(false)
      expect(Findings.unredacted(r)).toEqual([])
      expect(Findings.ReportedSchema.safeParse(r).success).toBe(true)
    }
  })

  it("a detector, path or commit past its length is cut without splitting a character, so the finding still crosses the edge", () => {
    const emoji = "\u{1F600}"
    const f = Redaction.redact(key, "trufflehog", Findings.fieldMaps.trufflehog, { ...truffle("AKIAFAKE0000EXAMPLE1"), DetectorName: `a${emoji.repeat(300)}`, SourceMetadata: { Data: { Git: { file: `b${emoji.repeat(1200)}`, line: 1, commit: `c${emoji.repeat(150)}` } } } })
    expect([f.detector.length, f.path.length, (f.commit ?? "").length]).toEqual([499, 1999, 199])
    expect(WorkerApi.edgeIssue(f, 3)).toBeUndefined()
    expect(Findings.ReportedSchema.safeParse(f).success).toBe(true)
  })

  it("a line past Findings.maxLine (or negative, or not an integer) is reported as no line, so the server accepts the finding", () => {
    const at = (line: unknown) => Redaction.redact(key, "trufflehog", Findings.fieldMaps.trufflehog, { ...truffle("AKIAFAKE0000EXAMPLE1"), SourceMetadata: { Data: { Git: { file: "a.env", line } } } })
    expect(at(Findings.maxLine).line).toBe(Findings.maxLine)
    for (const line of [Findings.maxLine + 1, 2 ** 53, -1, 1.5, "x"]) expect(at(line).line, String(line)).toBeNull()
    expect(Findings.ReportedSchema.safeParse({ ...at(Findings.maxLine), line: Findings.maxLine + 1 }).success).toBe(false)
    expect(Findings.ReportedSchema.safeParse(at(Findings.maxLine)).success).toBe(true)
  })

  it("equal secrets fingerprint equally across calls and scanners; another key or secret gives another fingerprint; the field map finds detector, place and verified flag", () => {
    const a = Redaction.redact(key, "trufflehog", Findings.fieldMaps.trufflehog, truffle("AKIAFAKE0000EXAMPLE1"))
    const b = Redaction.redact(key, "trufflehog", Findings.fieldMaps.trufflehog, { ...truffle("AKIAFAKE0000EXAMPLE1"), SourceMetadata: { Data: { Git: { file: "b.env", line: 9 } } } })
    expect(a.fingerprint).toBe(b.fingerprint)
    expect(Redaction.redact("cd".repeat(32), "trufflehog", Findings.fieldMaps.trufflehog, truffle("AKIAFAKE0000EXAMPLE1")).fingerprint).not.toBe(a.fingerprint)
    expect(Redaction.redact(key, "trufflehog", Findings.fieldMaps.trufflehog, truffle("AKIAFAKE0000EXAMPLE2")).fingerprint).not.toBe(a.fingerprint)
    // trufflehog's fingerprint comes from RawV2; a secretlint finding of the same token matches a gitleaks one
    const gl = Redaction.redact(key, "gitleaks", Findings.fieldMaps.gitleaks, { RuleID: "x", Secret: "tok_FAKE_123456789", Match: "t=tok_FAKE_123456789", File: "f" })
    const sl = Redaction.redact(key, "secretlint", Findings.fieldMaps.secretlint, { ruleId: "y", message: "found tok_FAKE_123456789", data: { TOKEN: "tok_FAKE_123456789" }, filePath: "f" })
    expect(sl.fingerprint).toBe(gl.fingerprint)
    expect(a).toMatchObject({ scanner: "trufflehog", detector: "AWS", path: "a.env", line: 3, commit: "c1", verified: true, preview: "AKIA…(22)", secretFields: ["Raw", "RawV2"] })
    // a command scanner declares its own fields, at any depth
    const spec = Scanner.command({ name: "homegrown", command: "true", args: [], exitCodes: { "0": "clean" }, findings: { secretFields: ["apiToken"], detector: "kind", path: "where" } })
    const own = Redaction.redact(key, spec.name, Redaction.fieldMapOf(spec), { kind: "token", where: "x.json", meta: [{ apiToken: "FAKEtoken123456" }] })
    expect(JSON.stringify(own).includes("FAKEtoken123456")).toBe(false)
    expect(own).toMatchObject({ detector: "token", path: "x.json", secretFields: ["apiToken"] })
    // raw upload is opt-in
    expect(Redaction.redact(key, "trufflehog", Findings.fieldMaps.trufflehog, truffle("AKIAFAKE0000EXAMPLE1")).raw).toBeUndefined()
    expect(Redaction.redact(key, "trufflehog", Findings.fieldMaps.trufflehog, truffle("AKIAFAKE0000EXAMPLE1"), { rawUpload: true }).raw).toEqual({ Raw: "AKIAFAKE0000EXAMPLE1", RawV2: "AKIAFAKE0000EXAMPLE1/x" })
  })

  it.prop("a scrubbed text holds none of the clear values its findings declared secret, and keeps the rest", [fc.stringMatching(/^[A-Za-z0-9]{8,40}$/), fc.string({ maxLength: 40 })], ([secret, around]) => {
    fc.pre(!around.includes(secret) && !secret.includes("redacted"))
    const finding = { ruleId: "r", message: "m", data: { TOKEN: secret }, filePath: "f" }
    const values = Redaction.clearValues("secretlint", Findings.fieldMaps.secretlint, finding)
    const text = `${around}${secret}\n${secret}${around}`
    const out = Redaction.scrubText(key, text, values)
    expect(out.includes(secret)).toBe(false)
    expect(out.split("[redacted ").length - 1).toBe(2)
    expect(Redaction.scrubText(key, around, values)).toBe(around)
  })

  it("a real device: the scanner's secrets reach neither the server nor the device's own result queue", async () => {
    const dir = mkdtempSync(join(tmpdir(), "scanfleet-redaction-"))
    const serverDb = join(mkdtempSync(join(tmpdir(), "scanfleet-redaction-server-")), "server.db")
    const fleet = await Fleet.start({ scanSeconds: 20, databaseUrl: `sqlite:${serverDb}` })
    const secrets = ["PLANTEDdeviceAAAAAAAA1111", "PLANTEDdeviceBBBBBBBB2222"]
    let device: Supervisor.Device | null = null
    try {
      await fleet.seed(["acme/planted"])
      device = await Supervisor.start({
        server: fleet.url,
        token: fleet.token,
        slots: 1,
        scanner: Scanner.command({ name: "trufflehog", command: process.execPath, args: [fileURLToPath(new URL("./fixtures/planted-trufflehog.mjs", import.meta.url)), ...secrets], exitCodes: { "0": "clean", "183": "findings" }, stop: "SIGKILL" }),
        state: join(dir, "state.db"),
        workRoot: dir,
        pollMs: 100,
        onEvent: () => {}
      })
      const end = Date.now() + 30_000
      let stored: Awaited<ReturnType<typeof fleet.findings>> = []
      while (Date.now() < end && (stored = await fleet.findings()).length < 2) await new Promise((r) => setTimeout(r, 100))
      expect(stored.map((f) => [f.detector, f.path])).toEqual([["AWS", "keys/0.env"], ["AWS", "keys/1.env"]])
      expect(JSON.stringify(stored).includes("PLANTED")).toBe(false)
      await device.stop()
      device = null
      // the server's database holds the result (its log named each secret on stderr) but no secret: the log was scrubbed too
      const serverFiles = readdirSync(dirname(serverDb)).map((f) => join(dirname(serverDb), f))
      expect(serverFiles.some((f) => readFileSync(f).includes(Buffer.from("verifying candidate [redacted "))), "the scrubbed log line is stored").toBe(true)
      for (const f of serverFiles) for (const s of secrets) expect(readFileSync(f).includes(Buffer.from(s)), `${f} holds ${s}`).toBe(false)
      // the state database, its WAL, and whatever the stage folder still holds
      const files = readdirSync(dir, { recursive: true, withFileTypes: true }).filter((e) => e.isFile()).map((e) => join(e.parentPath, e.name))
      expect(files.length).toBeGreaterThan(0)
      for (const f of files) for (const s of secrets) expect(readFileSync(f).includes(Buffer.from(s)), `${f} holds ${s}`).toBe(false)
    } finally {
      await device?.stop()
      await fleet.close()
      rmSync(dir, { recursive: true, force: true })
      rmSync(dirname(serverDb), { recursive: true, force: true })
    }
  }, 60_000)
})
