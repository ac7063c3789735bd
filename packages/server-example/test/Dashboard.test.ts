import { Config, Promotion } from "@scanfleet/core"
import { Effect } from "effect"
import { existsSync, mkdirSync } from "node:fs"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { chromium, type Browser } from "playwright-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Database from "../src/Database.js"
import { sqliteFile } from "./fixtures/Databases.js"
import { adminToken, start, type Running } from "./fixtures/Harness.js"

const chromiumPath = "/usr/bin/chromium"
const haveChromium = existsSync(chromiumPath)
if (!haveChromium)
  console.warn(
    `\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n` +
      `!!! SKIPPED: the dashboard browser test needs Chromium at ${chromiumPath}.\n` +
      `!!! Install it with: apt-get install -y chromium   (npm test does this when run as root)\n` +
      `!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n`
  )

// Screenshots are kept as test artefacts (gitignored), as the console's are.
const artifacts = fileURLToPath(new URL("../../../test-artifacts/dashboard/", import.meta.url))

const ev = (seq: number, phase: string, at: number) => ({ seq, kind: "phase", phase, at })

describe.skipIf(!haveChromium)("dashboard in headless Chromium (SQLite file)", () => {
  const db = sqliteFile()
  let s: Running
  let browser: Browser
  const reservations: Array<number> = []
  let expiredId = 0
  let deviceToken = ""
  beforeAll(async () => {
    s = await start({ sweepIntervalMs: 50, storeLayer: Database.layer(db.url) })
    browser = await chromium.launch({
      executablePath: chromiumPath,
      args: ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]
    })
    // One assignment that expires (2 s TTL for github), two that stay active.
    const short: Config.ManagedConfig = {
      ...Config.defaults,
      assignments: { globalTtlSeconds: 2, handoffMarginSeconds: 0, overrides: { gitlab: { ttlSeconds: 7200 }, huggingface: { ttlSeconds: 7200 }, dockerhub: { ttlSeconds: 9000 } } },
      sources: { ...Config.defaults.sources, github: { ...Config.defaults.sources.github, scanTimeoutSeconds: 1, uploadTimeoutSeconds: 1 } }
    }
    expect((await s.admin("POST", "/v1/admin/config/apply", short)).status).toBe(201)
    const d = await s.addDevice("browser-device", 4)
    deviceToken = d.token
    const now = Date.now()
    await s.run(Effect.suspend(() => s.store.recordObservations([{ source: "github", identity: "octo/expiring", remoteAt: now - 1000 }], now)))
    const e = await s.device(d.token, "POST", "/v1/assignments/claim", { slot: 0 })
    expiredId = e.body.assignment.reservationId
    await s.device(d.token, "POST", `/v1/assignments/${expiredId}/progress`, { fence: e.body.assignment.fence, events: [ev(1, "assigned", now), ev(2, "scanning", now + 1)] })
    await s.run(
      Effect.suspend(() =>
        s.store.recordObservations(
          [
            { source: "dockerhub", identity: "library/nginx@sha256:abc", remoteAt: null },
            { source: "gitlab", identity: "group/project", remoteAt: now - 5000 }
          ],
          now
        )
      )
    )
    for (const slot of [1, 2]) {
      const r = await s.device(d.token, "POST", "/v1/assignments/claim", { slot })
      const a = r.body.assignment
      reservations.push(a.reservationId)
      await s.device(d.token, "POST", `/v1/assignments/${a.reservationId}/progress`, { fence: a.fence, events: [ev(1, "assigned", now), ev(2, slot === 1 ? "acquiring" : "cleanup", now + 2)] })
    }
    await s.run(
      Effect.suspend(() =>
        s.store.recordCycle({ source: "gitlab", startedAt: now - 9000, endedAt: now - 8000, pages: 2, results: 40, malformed: 0, queuedNewCount: 12, queuedUpdatedCount: 5, deferredCount: 1, stopReason: "end_of_listing", error: null })
      )
    )
    // A promotion counts deferred targets up to a limit; the dashboard says "at least" there.
    await s.run(
      Effect.suspend(() =>
        s.store.recordCycle({ source: "github", startedAt: now - 7000, endedAt: now - 6000, pages: 1, results: 10, malformed: 0, queuedNewCount: 0, queuedUpdatedCount: 100, deferredCount: Promotion.deferredCountLimit, stopReason: "end_of_listing", error: null })
      )
    )
    await s.run(
      Effect.suspend(() =>
        s.store.recordDurations([
          ...Array.from({ length: 25 }, (_, i) => ({ source: "dockerhub" as const, metric: "scanning" as const, outcome: "clean" as const, ms: 1000 + i * 37, at: now - 1000 })),
          ...Array.from({ length: 3 }, (_, i) => ({ source: "dockerhub" as const, metric: "upload" as const, outcome: "clean" as const, ms: 200 + i, at: now - 1000 }))
        ])
      )
    )
    for (let i = 0; i < 60; i++) {
      const v = await s.admin("GET", `/v1/admin/assignments/${expiredId}`)
      if (v.body.assignment.state === "expired") break
      await new Promise((r) => setTimeout(r, 100))
    }
  })
  afterAll(async () => {
    await browser?.close()
    await s?.close()
    db.cleanup()
  })

  it("without the admin token the dashboard answers 401 and shows no data", async () => {
    const page = await browser.newPage()
    const res = await page.goto(`${s.url}/`)
    expect(res?.status()).toBe(401)
    expect(await page.getByTestId("auth-error").isVisible()).toBe(true)
    expect(await page.getByTestId("active-table").count()).toBe(0)
    const wrong = await page.goto(`${s.url}/?token=not-the-admin-token`)
    expect(wrong?.status()).toBe(401)
    await page.close()
  })

  it("Operator inspects active work: the dashboard labels each deadline by its meaning, and its values match the admin API", async () => {
    const ctx = await browser.newContext()
    const page = await ctx.newPage()
    await page.goto(`${s.url}/?token=${adminToken}`)
    // The token leaves the address bar: it now lives in an HTTP-only cookie.
    expect(page.url()).toBe(`${s.url}/`)
    const [cookie] = await ctx.cookies()
    expect(cookie).toMatchObject({ name: "scanfleet_admin", httpOnly: true, sameSite: "Strict" })
    expect(cookie.value).not.toContain(adminToken)
    // The session cookie opens the dashboard only, never the admin API.
    expect((await fetch(`${s.url}/v1/admin/summary`, { headers: { cookie: `scanfleet_admin=${cookie.value}` } })).status).toBe(401)
    const headers = await page.locator("[data-testid=active-table] th").allTextContents()
    expect(headers).toEqual(expect.arrayContaining(["Target-scan deadline", "Result-upload deadline", "Assignment expiry", "Current phase", "Fires next"]))

    const api = (await s.admin("GET", "/v1/admin/assignments?state=active")).body.assignments
    expect(await page.getByTestId("active-count").textContent()).toBe(String(api.length))
    expect(api.map((a: any) => a.reservationId).sort()).toEqual([...reservations].sort())
    for (const a of api) {
      const id = a.reservationId
      const text = async (t: string) => (await page.getByTestId(t).textContent())?.trim()
      expect(await text(`active-${id}-target`)).toBe(`${a.target.source}:${a.target.identity}`)
      expect(await text(`active-${id}-phase`)).toBe(a.lastPhase)
      expect(await text(`active-${id}-target-scan-deadline-at`)).toBe(a.deadlines.targetScan.iso)
      expect(await text(`active-${id}-result-upload-deadline-at`)).toBe(a.deadlines.resultUpload.iso)
      expect(await text(`active-${id}-assignment-expiry-at`)).toBe(a.deadlines.assignmentExpiry.iso)
      expect(await text(`active-${id}-next`)).toBe(a.nextDeadline.label)
      expect(await text(`active-${id}-remaining`)).toMatch(/^(\d+h )?(\d+m )?\d+s$/)
      expect(await text(`active-${id}-policy`)).toBe(`${a.policy.origin} TTL ${a.policy.ttlSeconds} s`)
    }

    // Expired assignments with their evidence.
    const expired = (await s.admin("GET", `/v1/admin/assignments/${expiredId}`)).body.assignment
    expect(expired.state).toBe("expired")
    expect(await page.getByTestId(`expired-${expiredId}-last-phase`).textContent()).toBe(expired.expiry.lastPhase)
    expect(await page.getByTestId(`expired-${expiredId}-last-progress`).textContent()).toBe(new Date(expired.expiry.lastProgressAt).toISOString())
    expect(await page.getByTestId(`expired-${expiredId}-assignment-expiry`).textContent()).toBe(expired.deadlines.assignmentExpiry.iso)

    // Cycles: new and updated counts side by side.
    const cycles = (await s.admin("GET", "/v1/admin/cycles")).body.cycles
    const cycleHeaders = await page.locator("[data-testid=cycles-table] th").allTextContents()
    expect(cycleHeaders.indexOf("queued_updated_count") - cycleHeaders.indexOf("queued_new_count")).toBe(1)
    for (const c of cycles) {
      expect(await page.getByTestId(`cycle-${c.id}-queued-new`).textContent()).toBe(String(c.queuedNewCount))
      expect(await page.getByTestId(`cycle-${c.id}-queued-updated`).textContent()).toBe(String(c.queuedUpdatedCount))
      expect(await page.getByTestId(`cycle-${c.id}-deferred`).textContent()).toBe(c.deferredCount >= Promotion.deferredCountLimit ? "≥ 10,000" : String(c.deferredCount))
    }
    expect(cycles.some((c: { deferredCount: number }) => c.deferredCount === Promotion.deferredCountLimit)).toBe(true)

    // Percentiles with counts and insufficient labels.
    const pct = (await s.admin("GET", "/v1/admin/percentiles")).body
    expect(pct.rows.length).toBeGreaterThan(0)
    expect(await page.getByTestId("percentiles-min-samples").textContent()).toBe(String(pct.minSamples))
    let insufficient = 0
    for (const r of pct.rows) {
      const k = `${r.source}-${r.metric}-${r.outcome}`
      expect(await page.getByTestId(`pct-${k}-count`).textContent()).toBe(String(r.count))
      for (const q of ["p50", "p95", "p99"]) {
        const shown = await page.getByTestId(`pct-${k}-${q}`).textContent()
        if (r[q].status === "ok") expect(shown).toBe(`${Math.round(r[q].value)} ms`)
        else {
          insufficient++
          expect(shown).toBe(`insufficient (${r[q].count} of ${r[q].required} samples)`)
        }
      }
    }
    expect(insufficient).toBeGreaterThan(0)
    expect(await page.getByTestId("pct-dockerhub-scanning-clean-p50").textContent()).toMatch(/^\d+ ms$/)

    // The headline numbers.
    const sum = (await s.admin("GET", "/v1/admin/summary")).body
    for (const [t, v] of [
      ["queued-new", sum.targets.queuedNew],
      ["queued-updated", sum.targets.queuedUpdated],
      ["running", sum.assignments.running],
      ["completed", sum.assignments.completed],
      ["timed-out", sum.assignments.timedOut],
      ["expired", sum.assignments.expired]
    ])
      expect(await page.getByTestId(`summary-${t}`).textContent(), t).toBe(String(v))
    if (process.env.SCANFLEET_DASHBOARD_SCREENSHOT) await page.screenshot({ path: process.env.SCANFLEET_DASHBOARD_SCREENSHOT, fullPage: true })
    await ctx.close()
  })

  it("a killed assignment is counted once (timed out, not also failed), and every value on the page is escaped by its templates", async () => {
    const before = (await s.admin("GET", "/v1/admin/summary")).body.assignments
    const now = Date.now()
    const evil = `evil/<img src=x onerror="document.title='owned'">`
    await s.run(Effect.suspend(() => s.store.recordObservations([{ source: "gitlab", identity: evil, remoteAt: now - 1000 }, { source: "gitlab", identity: "killed/one", remoteAt: now - 1000 }], now)))
    // ahead of the expired github target waiting in the queue
    for (const identity of [evil, "killed/one"]) expect((await s.admin("POST", "/v1/admin/targets/priority", { source: "gitlab", identity, priority: 100, reason: "test" })).status).toBe(200)
    const held = (await s.device(deviceToken, "POST", "/v1/assignments/claim", { slot: 3 })).body.assignment
    expect(held.target.identity).toBe(evil)
    const killed = (await s.device(deviceToken, "POST", "/v1/assignments/claim", { slot: 0 })).body.assignment
    expect(killed.target.identity).toBe("killed/one")
    const r = await s.device(deviceToken, "POST", `/v1/assignments/${killed.reservationId}/result`, { fence: killed.fence, outcome: "killed_at_deadline", finalPhase: "scanning", findings: [] })
    expect(r.status, JSON.stringify(r.body)).toBe(200)
    const after = (await s.admin("GET", "/v1/admin/summary")).body.assignments
    expect([after.timedOut - before.timedOut, after.failed - before.failed]).toEqual([1, 0])

    const ctx = await browser.newContext()
    const page = await ctx.newPage()
    await page.goto(`${s.url}/?token=${adminToken}`)
    expect(await page.getByTestId("summary-timed-out").textContent()).toBe(String(after.timedOut))
    expect(await page.getByTestId("summary-failed").textContent()).toBe(String(after.failed))
    const cell = page.getByTestId(`active-${held.reservationId}-target`)
    expect(await cell.textContent()).toBe(`gitlab:${evil}`)
    expect(await cell.getAttribute("title")).toBe(`gitlab:${evil}`)
    expect(await page.locator("img").count()).toBe(0)
    expect(await page.title()).toBe("scanfleet dashboard")
    mkdirSync(artifacts, { recursive: true })
    await page.screenshot({ path: join(artifacts, "dashboard.png"), fullPage: true })
    await ctx.close()
  })
})
