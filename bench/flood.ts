/**
 * `npm run flood [-- --mib 200] [-- --containment LEVEL]` (from bench/, after `npm run build` at the root)
 *
 * Bounded memory under an output flood: one execution unit per kind of flood
 * (JSON lines, each a finding; plain text lines; one line without a newline)
 * whose scanner prints `--mib` MiB to stdout as fast as the pipe takes it and
 * exits. This process is the controller. Prints the peak resident memory
 * (VmHWM from /proc) of the controller and of the unit, what the result kept
 * and what it says was cut; fails if the controller passes 200 MiB or the
 * unit 256 MiB.
 */
import { Containment, ExecutionUnit, Permits } from "@scanfleet/worker"
import { Effect } from "effect"
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

const args = process.argv.slice(2)
const value = (name: string): string | undefined => {
  const i = args.indexOf(`--${name}`)
  return i >= 0 ? args[i + 1] : args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3)
}
const mib = Number(value("mib") ?? 200)
const level = value("containment")
const plan = await Effect.runPromise(Containment.detect(level !== undefined ? { force: level } : {}))

const peakKiB = (): number => Number(/VmHWM:\s+(\d+)/.exec(readFileSync("/proc/self/status", "utf8"))?.[1] ?? 0)

const dir = mkdtempSync(join(tmpdir(), "scanfleet-bench-flood-"))
const scanner = join(dir, "flood.mjs")
writeFileSync(
  scanner,
  `const [mode, bytes] = process.argv.slice(2)
const total = Number(bytes)
const line = mode === "json" ? JSON.stringify({ detector: "Flood", file: "config/settings.env", line: 1, secret: "x".repeat(120) }) + "\\n"
  : mode === "text" ? "plain text progress output, not a finding ".repeat(3) + "\\n" : "y".repeat(1024)
const block = Buffer.from(line.repeat(Math.max(1, Math.floor(1048576 / line.length))))
let written = 0
const next = () => {
  while (written < total) {
    const n = Math.min(block.length, total - written)
    written += n
    if (!process.stdout.write(n === block.length ? block : block.subarray(0, n))) return void process.stdout.once("drain", next)
  }
  process.stdout.end(() => process.exit(0))
}
next()
`
)

const before = peakKiB()
console.log(`flood: ${mib} MiB of stdout per unit, containment ${plan.level}; controller peak before: ${(before / 1024).toFixed(0)} MiB`)
let failed = false
for (const mode of ["json", "text", "oneline"] as const) {
  const started = Date.now()
  const deadline = started + 300_000
  const end = await ExecutionUnit.run({
    job: {
      reservationId: 1,
      target: { id: 1, source: "github", identity: `flood/${mode}` },
      workDir: join(dir, `work-${mode}`),
      stageFile: join(dir, `stage-${mode}.json`),
      scanner: { kind: "command", name: "flood", command: process.execPath, args: [], exitCodes: { "0": "clean" }, otherwise: "scan_error", stop: "SIGTERM" },
      args: [scanner, mode, String(mib * 1024 * 1024)],
      acquireArgs: [],
      scanDeadline: deadline
    },
    deadline,
    graceMs: 2000,
    permits: Permits.make(1),
    containment: plan,
    onSpawn: async () => {},
    onPhase: async () => {}
  })
  if (end.kind !== "staged") {
    console.log(`  ${mode}: the unit ended ${end.kind} (expected a staged result)`)
    failed = true
    continue
  }
  const unit = (end.unitPeakRssKiB ?? 0) / 1024
  const controller = peakKiB() / 1024
  const cut = end.staged.cut
  console.log(
    `  ${mode.padEnd(7)} ${((Date.now() - started) / 1000).toFixed(1)} s   unit peak ${unit.toFixed(0)} MiB   controller peak ${controller.toFixed(0)} MiB   ` +
      `kept ${end.staged.findings.length} findings (${Buffer.byteLength(JSON.stringify(end.staged))} bytes staged); cut ${cut?.findings ?? 0} findings, ${cut?.longLines ?? 0} long lines, ` +
      `${cut?.unstoredBytes ?? 0} stdout bytes not stored`
  )
  if (unit >= 256 || controller >= 200 || end.unitPeakRssKiB === null) failed = true
}
rmSync(dir, { recursive: true, force: true })
if (failed) process.exitCode = 1
