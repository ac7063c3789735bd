// The execution unit of one assignment's scan stage. The controller starts
// this script as the leader of its own process group and talks to it over the
// IPC channel: the unit reports each phase it enters, asks for a scan permit,
// runs the scanner and stages the result in a file. The controller's watchdog
// alone decides when the unit must die; the unit never looks at a clock.
import { mkdir, rm, writeFile, rename, open } from "node:fs/promises"
import { pathToFileURL } from "node:url"

const order = ["permit_wait", "preparing", "acquiring", "scanning", "filtering", "cleanup", "staging"]
const LOG_LIMIT = 60_000
let current = -1
let log = ""

const send = (msg) =>
  new Promise((resolve) => {
    if (!process.connected) return resolve()
    process.send(msg, undefined, {}, () => resolve())
  })

const enter = (phase) => {
  const i = order.indexOf(phase)
  if (i <= current) return
  current = i
  void send({ t: "phase", phase, at: Date.now() })
}

const appendLog = (text) => {
  log += text
  // Keep the tail: the end of a log says why a scan stopped.
  if (log.length > LOG_LIMIT) log = log.slice(log.length - LOG_LIMIT)
}

// The controller is gone (crashed or killed): take the whole group down with
// us rather than leave orphans. A restarted controller also kills the group.
process.on("disconnect", () => {
  try {
    process.kill(-process.pid, "SIGKILL")
  } catch {
    process.exit(1)
  }
})

let permitGranted
const permit = new Promise((resolve) => (permitGranted = resolve))

process.on("message", (msg) => {
  if (msg && msg.t === "permit") permitGranted()
  if (msg && msg.t === "start") void run(msg.job)
})

const runCommand = async (job) => {
  // Loaded here, not at the top, so the unit reports its first phase as early as it can.
  const { execa } = await import("execa")
  const spec = job.scanner
  if (spec.acquire) {
    enter("acquiring")
    const acq = await execa(spec.acquire.command, job.acquireArgs, { cwd: job.workDir, reject: false, stdin: "ignore", all: true, env: spec.env })
    appendLog(String(acq.all ?? ""))
    if (acq.exitCode !== 0) return { kind: "outcome", outcome: "scan_error", findings: [], log: `${log}\nacquisition failed with exit ${acq.exitCode ?? acq.signal}` }
  }
  enter("scanning")
  const sub = execa(spec.command, job.args, { cwd: job.workDir, reject: false, stdin: "ignore", buffer: false, env: spec.env })
  void send({ t: "scanner", pid: sub.pid })
  sub.stderr.setEncoding("utf8")
  sub.stderr.on("data", (d) => appendLog(d))
  const lines = []
  let pending = ""
  sub.stdout.setEncoding("utf8")
  sub.stdout.on("data", (d) => {
    pending += d
    let nl
    while ((nl = pending.indexOf("\n")) >= 0) {
      lines.push(pending.slice(0, nl))
      pending = pending.slice(nl + 1)
    }
  })
  const done = await sub
  if (pending.length > 0) lines.push(pending)
  enter("filtering")
  const findings = []
  let malformed = 0
  for (const line of lines) {
    if (line.trim() === "") continue
    try {
      const v = JSON.parse(line)
      if (v !== null && typeof v === "object" && !Array.isArray(v)) findings.push(v)
      else malformed++
    } catch {
      malformed++
    }
  }
  if (malformed > 0) appendLog(`\n${malformed} stdout line(s) were not JSON objects and were dropped`)
  enter("cleanup")
  await rm(job.workDir, { recursive: true, force: true })
  return { kind: "exit", code: done.exitCode ?? null, signal: done.signal ?? null, findings, malformed, log }
}

const runModule = async (job) => {
  const spec = job.scanner
  const mod = await import(pathToFileURL(spec.module).href)
  const fn = mod[spec.exportName]
  if (typeof fn !== "function") throw new Error(`module ${spec.module} exports no function named ${spec.exportName}`)
  const out = await fn({
    target: job.target,
    workDir: job.workDir,
    scanDeadline: job.scanDeadline,
    options: spec.options,
    enter,
    log: (line) => appendLog(`${line}\n`)
  })
  const outcome = ["clean", "findings", "scan_error", "unsupported", "usage"].includes(out?.outcome) ? out.outcome : "scan_error"
  const findings = Array.isArray(out?.findings) ? out.findings.filter((f) => f !== null && typeof f === "object" && !Array.isArray(f)) : []
  if (typeof out?.log === "string") appendLog(out.log)
  return { kind: "outcome", outcome, findings, log }
}

const run = async (job) => {
  try {
    enter("permit_wait")
    await send({ t: "permit_request" })
    await permit
    enter("preparing")
    await mkdir(job.workDir, { recursive: true })
    const staged = job.scanner.kind === "command" ? await runCommand(job) : await runModule(job)
    enter("staging")
    const tmp = `${job.stageFile}.tmp`
    await writeFile(tmp, JSON.stringify(staged))
    const fh = await open(tmp, "r")
    await fh.sync()
    await fh.close()
    await rename(tmp, job.stageFile)
    await send({ t: "staged", at: Date.now() })
    process.exit(0)
  } catch (e) {
    await send({ t: "failed", message: String(e && e.stack ? e.stack : e).slice(0, 4000), at: Date.now() })
    process.exit(1)
  }
}
