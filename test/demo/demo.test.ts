import { spawn, type ChildProcess } from "node:child_process"
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { chromium } from "playwright-core"
import { afterAll, describe, expect, it } from "vitest"

// The demo as a newcomer runs it: `npm start` in a child process of its own
// process group (as a terminal would), on an empty data folder, then Ctrl-C.
// This is the command of README.md and docs/getting-started.md, and the admin
// API calls shown in docs/operating.md are the ones made here.

const root = resolve(__dirname, "../..")
const chromiumPath = "/usr/bin/chromium"
const haveChromium = existsSync(chromiumPath)
if (!haveChromium)
  console.warn(
    `\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n` +
      `!!! SKIPPED (browser part only): the demo dashboard check needs Chromium at ${chromiumPath}.\n` +
      `!!! Install it with: apt-get install -y chromium   (npm test does this when run as root)\n` +
      `!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n`
  )

const dataDir = mkdtempSync(join(tmpdir(), "scanfleet-demo-"))
let child: ChildProcess | null = null
let output = ""

afterAll(() => {
  // A failed test must not leave the fleet running.
  if (child?.pid && child.exitCode === null && child.signalCode === null) {
    try {
      process.kill(-child.pid, "SIGKILL")
    } catch {
      // already gone
    }
  }
  rmSync(dataDir, { recursive: true, force: true })
})

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** Every live descendant of a process, from /proc. */
const descendants = (pid: number): Array<number> => {
  const parent = new Map<number, number>()
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue
    try {
      const stat = readFileSync(`/proc/${d}/stat`, "utf8")
      parent.set(Number(d), Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]))
    } catch {
      // exited while we looked
    }
  }
  const out: Array<number> = []
  const walk = (p: number) => {
    for (const [c, pp] of parent) if (pp === p) (out.push(c), walk(c))
  }
  walk(pid)
  return out
}

const alive = (pid: number): boolean => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z"
  } catch {
    return false
  }
}

const until = async <A>(what: string, ms: number, probe: () => Promise<A | null | undefined | false>): Promise<A> => {
  const end = Date.now() + ms
  let last: unknown = null
  for (;;) {
    try {
      const v = await probe()
      if (v) return v
    } catch (e) {
      last = e
    }
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}${last ? ` (last error: ${String(last)})` : ""}\n--- demo output ---\n${output.slice(-3000)}`)
    await sleep(500)
  }
}

interface Summary {
  targets: { queuedNew: number; queuedUpdated: number; pending: number }
  assignments: { running: number; completed: number; timedOut: number; failed: number; expired: number }
}
interface View {
  reservationId: number
  target: { source: string; identity: string; coveredRemoteAt: number | null }
  state: string
  outcome: string | null
  finalPhase: string | null
}
interface Cycle {
  id: number
  source: string
  queuedNewCount: number
  queuedUpdatedCount: number
}

describe("npm start: the demo fleet", () => {
  it(
    "on an empty data folder: targets discovered, scanned and completed; a changed target promoted as updated and rescanned once; one assignment timed out with its final phase named; the dashboard shows the same numbers; Ctrl-C leaves no process behind",
    async () => {
      const started = Date.now()
      child = spawn("npm", ["start", "--silent", "--", "--data", dataDir, "--port", "0"], {
        cwd: root,
        detached: true,
        stdio: ["ignore", "pipe", "pipe"],
        env: { ...process.env, SCANFLEET_ADMIN_TOKEN: "", SCANFLEET_DATABASE_URL: "" }
      })
      child.stdout!.setEncoding("utf8").on("data", (d: string) => (output += d))
      child.stderr!.setEncoding("utf8").on("data", (d: string) => (output += d))
      const pid = child.pid!

      const dashboardUrl = await until("the dashboard URL on stdout", 60_000, async () => /Dashboard: (http:\/\/\S+)/.exec(output)?.[1])
      expect(Date.now() - started).toBeLessThan(60_000)
      const url = new URL(dashboardUrl)
      const token = url.searchParams.get("token")!
      expect(token.length).toBeGreaterThanOrEqual(16)
      const api = async <A>(path: string): Promise<A> => {
        const res = await fetch(`${url.origin}${path}`, { headers: { authorization: `Bearer ${token}` } })
        if (res.status !== 200) throw new Error(`${path}: HTTP ${res.status} ${await res.text()}`)
        return (await res.json()) as A
      }

      const pids = new Set<number>()
      const collect = () => descendants(pid).forEach((p) => pids.add(p))

      // Real content: the workers clone the fake sources' git repositories and secretlint scans them.
      interface FindingRow { id: number; identity: string; detector: string; path: string; status: string; preview: string; fingerprint: string }
      await until("a first real finding", 60_000, async () => (await api<{ findings: Array<FindingRow> }>("/v1/admin/findings?limit=10")).findings.length > 0)
      expect(Date.now() - started, "real findings within 60 s of npm start").toBeLessThan(60_000)

      const seen = await until("discovery, scans, an updated rescan and a timeout", 90_000, async () => {
        collect()
        const summary = await api<Summary>("/v1/admin/summary")
        const { cycles } = await api<{ cycles: Array<Cycle> }>("/v1/admin/cycles?limit=500")
        const completed = (await api<{ assignments: Array<View> }>("/v1/admin/assignments?state=completed&limit=1000")).assignments
        const failed = (await api<{ assignments: Array<View> }>("/v1/admin/assignments?state=failed&limit=1000")).assignments
        const expired = (await api<{ assignments: Array<View> }>("/v1/admin/assignments?state=expired&limit=100")).assignments
        expect(Array.isArray(expired)).toBe(true)
        const updatedCycle = cycles.find((c) => c.queuedUpdatedCount > 0)
        const timedOut = failed.find((a) => a.outcome === "killed_at_deadline")
        const byTarget = new Map<string, Array<View>>()
        for (const a of completed) byTarget.set(`${a.target.source}:${a.target.identity}`, [...(byTarget.get(`${a.target.source}:${a.target.identity}`) ?? []), a])
        const rescanned = [...byTarget.entries()].find(([, as]) => as.length >= 2)
        if (summary.targets.queuedNew === 0 || summary.assignments.completed === 0 || !updatedCycle || !timedOut || !rescanned) return null
        return { summary, updatedCycle, timedOut, rescanned, byTarget }
      })

      // The pushed repository's rescan: the commit added one fake credential and removed another.
      const api2 = await until("the pushed repository rescanned: one finding new, one resolved, one still present", 60_000, async () => {
        const t = await api<{ findings: Array<FindingRow>; scans: Array<{ new: number; present: number; resolved: number }> }>("/v1/admin/findings/target?source=github&identity=acme%2Fapi")
        return t.scans.length >= 2 ? t : null
      })
      expect(api2.scans.map((x) => [x.new, x.present, x.resolved])).toEqual([[2, 0, 0], [1, 1, 1]])
      expect(Object.fromEntries(api2.findings.map((f) => [f.path, f.status]))).toEqual({ "config/chat.env": "resolved", "config/deploy.env": "open", "ci/.npmrc": "new" })
      expect(api2.findings.every((f) => f.detector.startsWith("@secretlint/") && f.fingerprint.startsWith("hmac-sha256:") && !f.preview.includes("FAKEdemo"))).toBe(true)

      // Discovered and completed.
      expect(seen.summary.targets.queuedNew).toBeGreaterThan(0)
      expect(seen.summary.assignments.completed).toBeGreaterThan(0)
      // Promoted as updated, and rescanned once: two scans, the second covering a newer remote revision.
      expect(seen.updatedCycle.queuedUpdatedCount).toBeGreaterThan(0)
      const [rescannedTarget, scans] = seen.rescanned
      const ordered = [...scans].sort((a, b) => a.reservationId - b.reservationId)
      expect(ordered, `${rescannedTarget} is rescanned once, not more`).toHaveLength(2)
      expect(ordered[1].target.coveredRemoteAt!).toBeGreaterThan(ordered[0].target.coveredRemoteAt ?? 0)
      for (const [t, as] of seen.byTarget) expect(as.length, `${t} scanned at most twice (one push after its first scan)`).toBeLessThanOrEqual(2)
      // Timed out, with the phase the target-scan deadline fired in.
      expect(seen.timedOut.outcome).toBe("killed_at_deadline")
      expect(seen.timedOut.finalPhase).toEqual(expect.any(String))
      expect(seen.timedOut.target.identity).toContain("slow")

      if (haveChromium) {
        const browser = await chromium.launch({
          executablePath: chromiumPath,
          args: ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]
        })
        try {
          const page = await browser.newPage()
          const read = async (id: string) => Number(await page.getByTestId(id).innerText())
          // The fleet keeps working: compare while the API answers the same before and after the page is read.
          await until("the dashboard showing the API's numbers", 30_000, async () => {
            collect()
            const before = await api<Summary>("/v1/admin/summary")
            await page.goto(dashboardUrl)
            const shown = {
              queuedNew: await read("summary-queued-new"),
              queuedUpdated: await read("summary-queued-updated"),
              completed: await read("summary-completed"),
              timedOut: await read("summary-timed-out")
            }
            const after = await api<Summary>("/v1/admin/summary")
            const api1 = { queuedNew: before.targets.queuedNew, queuedUpdated: before.targets.queuedUpdated, completed: before.assignments.completed, timedOut: before.assignments.timedOut }
            const api2 = { queuedNew: after.targets.queuedNew, queuedUpdated: after.targets.queuedUpdated, completed: after.assignments.completed, timedOut: after.assignments.timedOut }
            if (JSON.stringify(api1) !== JSON.stringify(api2)) return null
            expect(shown).toEqual(api1)
            expect(shown.queuedUpdated).toBeGreaterThan(0)
            expect(shown.timedOut).toBeGreaterThan(0)
            return true
          })
          // The findings panel: the same counts as the API, and the pushed repository's resolved credential.
          const byStatus = async (status: string) => (await api<{ findings: Array<FindingRow> }>(`/v1/admin/findings?status=${status}&limit=1000`)).findings
          // The fleet keeps scanning (a scan may resolve or add a finding meanwhile): compare while the API answers the same before and after the page is read.
          await until("the findings panel showing the API's counts", 30_000, async () => {
            const counts = async () => [(await byStatus("resolved")).length, (await byStatus("new")).length]
            const before = await counts()
            await page.goto(`${url.origin}/`)
            const shown = [Number(await page.getByTestId("findings-resolved").innerText()), Number(await page.getByTestId("findings-new").innerText())]
            const after = await counts()
            if (JSON.stringify(before) !== JSON.stringify(after)) return null
            expect(shown).toEqual(after)
            return true
          })
          const resolvedRow = api2.findings.find((f) => f.path === "config/chat.env")!
          expect(await page.getByTestId(`finding-${resolvedRow.id}-status`).innerText()).toBe("resolved")
          expect(await page.getByTestId(`finding-${resolvedRow.id}-target`).innerText()).toBe("github:acme/api")
          // The cycle that promoted the changed target, with its count, as the API has it.
          expect(Number(await page.getByTestId(`cycle-${seen.updatedCycle.id}-queued-updated`).innerText())).toBe(seen.updatedCycle.queuedUpdatedCount)
        } finally {
          await browser.close()
        }
      }

      // Ctrl-C: SIGINT to the whole foreground process group.
      collect()
      expect(pids.size).toBeGreaterThan(0)
      const exited = new Promise<string>((r) => child!.once("exit", (code, signal) => r(signal ?? `code ${code}`)))
      process.kill(-pid, "SIGINT")
      const how = await Promise.race([exited, sleep(40_000).then(() => "still running after 40 s")])
      // npm re-raises the signal on itself once its script has ended; the demo itself exits 0 after stopping.
      expect(["code 0", "SIGINT"], output.slice(-2000)).toContain(how)
      expect(output).toContain("stopped.")
      await until("every process of the demo's tree to be gone", 5000, async () => [...pids, pid].every((p) => !alive(p)))
      expect([...pids, pid].filter(alive)).toEqual([])
    },
    300_000
  )
})
