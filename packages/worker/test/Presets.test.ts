import { Cli, Scanner, Supervisor } from "@scanfleet/worker"
import { Effect } from "effect"
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { delimiter, join } from "node:path"
import { afterAll, afterEach, describe, expect, it } from "vitest"
import * as Fleet from "./support/Fleet.js"
import { useNoOrphans } from "./support/NoOrphans.js"

useNoOrphans()

const dir = mkdtempSync(join(tmpdir(), "scanfleet-presets-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))
const cleanups: Array<() => Promise<void>> = []
const originalPath = process.env.PATH
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c()
  process.env.PATH = originalPath
})

const vars = (source: "github" | "gitlab" | "huggingface" | "dockerhub", identity: string) => ({ source, identity, workDir: "/work/r1", targetId: 7 })
const argv = (spec: Scanner.ParsedSpec, source: "github" | "gitlab" | "huggingface" | "dockerhub", identity: string) => {
  if (spec.kind !== "command") throw new Error("a command preset")
  return Scanner.commandLine(spec, vars(source, identity))
}
const flags = ["--json", "--no-update", "--fail"]

describe("scanner presets: the real command lines", () => {
  it("trufflehog scans GitHub and GitLab with git on the target's own host", () => {
    expect(argv(Scanner.trufflehog(), "github", "acme/app")).toEqual(["trufflehog", "git", "https://github.com/acme/app.git", ...flags])
    expect(argv(Scanner.trufflehog(), "gitlab", "group/sub/proj")).toEqual(["trufflehog", "git", "https://gitlab.com/group/sub/proj.git", ...flags])
    // Self-hosted: the hosts come from the sources' baseUrl as the discovery clients take it.
    const hosted = Scanner.trufflehog({ githubBaseUrl: "https://ghe.example.com/api/v3", gitlabBaseUrl: "https://git.example.org/gitlab/" })
    expect(argv(hosted, "github", "acme/app")).toEqual(["trufflehog", "git", "https://ghe.example.com/acme/app.git", ...flags])
    expect(argv(hosted, "gitlab", "group/proj")).toEqual(["trufflehog", "git", "https://git.example.org/gitlab/group/proj.git", ...flags])
    expect(Scanner.gitHost("github", "https://api.github.com")).toBe("https://github.com")
    expect(Scanner.gitHost("gitlab", "https://gitlab.example.org/api/v4")).toBe("https://gitlab.example.org")
  })

  it("trufflehog picks --model, --space or --dataset from the HuggingFace identity's kind", () => {
    expect(argv(Scanner.trufflehog(), "huggingface", "models/acme/bert")).toEqual(["trufflehog", "huggingface", "--model=acme/bert", ...flags])
    expect(argv(Scanner.trufflehog(), "huggingface", "spaces/acme/demo")).toEqual(["trufflehog", "huggingface", "--space=acme/demo", ...flags])
    expect(argv(Scanner.trufflehog(), "huggingface", "datasets/acme/corpus")).toEqual(["trufflehog", "huggingface", "--dataset=acme/corpus", ...flags])
    expect(argv(Scanner.trufflehog({ huggingfaceEndpoint: "https://hub.example.org" }), "huggingface", "models/a/b")).toEqual([
      "trufflehog", "huggingface", "--endpoint=https://hub.example.org", "--model=a/b", ...flags
    ])
  })

  it("trufflehog scans a DockerHub image by the digest that was discovered", () => {
    const digest = `sha256:${"ab".repeat(32)}`
    expect(argv(Scanner.trufflehog(), "dockerhub", `acme/app:1.4@${digest}`)).toEqual(["trufflehog", "docker", `--image=acme/app@${digest}`, ...flags])
  })

  it("trufflehog's exit codes: 183 (--fail) is findings, 0 clean, anything else an error; SIGKILL at the deadline", () => {
    const spec = Scanner.trufflehog()
    const exit = (code: number) => Scanner.classify(spec, { kind: "exit", code, signal: null, findings: [], malformed: 0, log: "" })
    expect([exit(183), exit(0), exit(1), exit(2)]).toEqual(["findings", "clean", "scan_error", "scan_error"])
    expect(spec.stop).toBe("SIGKILL")
  })

  it("gitleaks clones a git target into the work folder and scans its history; other sources are unsupported", () => {
    const spec = Scanner.gitleaks({ gitlabBaseUrl: "https://git.example.org" })
    if (spec.kind !== "command" || !spec.acquire) throw new Error("gitleaks clones first")
    expect([spec.acquire.command, ...Scanner.expand(spec.acquire.args, vars("gitlab", "group/proj"), spec.hosts)]).toEqual([
      "git", "clone", "--quiet", "--", "https://git.example.org/group/proj.git", "/work/r1/repo"
    ])
    expect(argv(spec, "github", "acme/app")).toEqual([
      "gitleaks", "git", "--no-banner", "--log-level=warn", "--exit-code=42", "--report-format=template",
      `--report-template=${Scanner.gitleaksTemplate()}`, "--report-path=-", "/work/r1/repo"
    ])
    // The template prints each finding as one JSON line, which is what the execution unit parses.
    expect(readFileSync(Scanner.gitleaksTemplate(), "utf8")).toContain("toJson")
    const exit = (code: number) => Scanner.classify(spec, { kind: "exit", code, signal: null, findings: [], malformed: 0, log: "" })
    expect([exit(0), exit(42), exit(1), exit(126)]).toEqual(["clean", "findings", "scan_error", "usage"])
    expect(Scanner.supports(spec, "huggingface")).toBe(false)
    expect(Scanner.supports(spec, "dockerhub")).toBe(false)
    expect(Scanner.supports(Scanner.trufflehog(), "dockerhub")).toBe(true)
  })

  it("a preset whose binary is missing is refused at start, naming it (a real PATH lookup)", async () => {
    const bin = join(dir, "bin-present")
    mkdirSync(bin, { recursive: true })
    writeFileSync(join(bin, "trufflehog"), "#!/bin/sh\nexit 0\n")
    chmodSync(join(bin, "trufflehog"), 0o755)
    writeFileSync(join(bin, "gitleaks"), "not executable\n")
    expect(Scanner.which("trufflehog", bin)).toBe(join(bin, "trufflehog"))
    // A file that is there but not executable is as good as missing.
    expect(Scanner.which("gitleaks", bin)).toBeNull()
    await Effect.runPromise(Scanner.requireBinaries(Scanner.trufflehog(), bin))
    const missing = await Effect.runPromise(Effect.flip(Scanner.requireBinaries(Scanner.gitleaks(), [bin, "/usr/bin", "/bin"].join(delimiter))))
    expect(missing).toMatchObject({ _tag: "ScannerMissing", scanner: "gitleaks", command: "gitleaks" })
    expect(missing.message).toContain('"gitleaks"')

    // The device itself refuses to start, before it touches its state file.
    process.env.PATH = ["/usr/bin", "/bin"].join(delimiter)
    const state = join(dir, "refused.db")
    await expect(Supervisor.start({ server: "http://127.0.0.1:9", token: "t", slots: 1, state, scanner: Scanner.trufflehog() })).rejects.toMatchObject({
      _tag: "ScannerMissing",
      command: "trufflehog"
    })
    const err: Array<string> = []
    const code = await Cli.main(["run", "--server", "http://127.0.0.1:9", "--token", "t", "--scanner", "gitleaks", "--state", state], { out: () => {}, err: (s) => err.push(s) })
    expect(code).toBe(1)
    expect(err.join("")).toMatch(/gitleaks.*not on PATH/)
  })

  it("trufflehog runs as the preset says through a real device: argv as built, credentials from the environment only, 183 is findings", async () => {
    const bin = join(dir, "bin-fake")
    mkdirSync(bin, { recursive: true })
    const record = join(dir, "trufflehog-call.json")
    // A stand-in for the binary (the real one is not on this machine): it records how it was called.
    writeFileSync(
      join(bin, "trufflehog"),
      `#!${process.execPath}\n` +
        `require("node:fs").writeFileSync(${JSON.stringify(record)}, JSON.stringify({ argv: process.argv.slice(2), hasToken: process.env.HUGGINGFACE_TOKEN === "hf_secret_value_123" }))\n` +
        `process.stdout.write(JSON.stringify({ DetectorName: "AWS", Raw: "AKIA..." }) + "\\n")\n` +
        `process.exit(183)\n`
    )
    chmodSync(join(bin, "trufflehog"), 0o755)
    process.env.PATH = [bin, originalPath].join(delimiter)
    process.env.HUGGINGFACE_TOKEN = "hf_secret_value_123"
    cleanups.push(async () => {
      delete process.env.HUGGINGFACE_TOKEN
    })
    const fleet = await Fleet.start({ scanSeconds: 20 })
    cleanups.push(() => fleet.close())
    await fleet.seed(["acme/leaky"])
    const events: Array<Supervisor.DeviceEvent> = []
    const device = await Supervisor.start({
      server: fleet.url,
      token: fleet.token,
      slots: 1,
      state: join(dir, "fake-trufflehog.db"),
      scanner: Scanner.trufflehog(),
      pollMs: 50,
      drainMs: 500,
      onEvent: (e) => events.push(e)
    })
    cleanups.push(() => device.stop())
    const deadline = Date.now() + 20_000
    while (!events.some((e) => e.type === "delivered") && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50))
    const delivered = events.find((e) => e.type === "delivered")
    expect(delivered, JSON.stringify(events)).toBeDefined()
    const a = await fleet.assignment(delivered!.type === "delivered" ? delivered!.reservationId : 0)
    expect(a.outcome).toBe("findings")
    const call = JSON.parse(readFileSync(record, "utf8")) as { argv: Array<string>; hasToken: boolean }
    expect(call.argv).toEqual(["git", "https://github.com/acme/leaky.git", ...flags])
    expect(call.hasToken).toBe(true)
    expect(call.argv.join(" ")).not.toContain("hf_secret_value_123")
  })
})
