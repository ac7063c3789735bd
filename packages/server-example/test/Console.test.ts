import { Config } from "@scanfleet/core"
import { Effect } from "effect"
import { existsSync, mkdirSync } from "node:fs"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { chromium, type Browser, type BrowserContext, type Page } from "playwright-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Database from "../src/Database.js"
import { sqliteFile } from "./fixtures/Databases.js"
import { adminToken, start, type Running } from "./fixtures/Harness.js"

const chromiumPath = "/usr/bin/chromium"
const haveChromium = existsSync(chromiumPath)
if (!haveChromium)
  console.warn(
    `\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n` +
      `!!! SKIPPED: the operator console browser test needs Chromium at ${chromiumPath}.\n` +
      `!!! Install it with: apt-get install -y chromium   (npm test does this when run as root)\n` +
      `!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n`
  )

// Screenshots are kept as test artefacts (gitignored).
const artifacts = fileURLToPath(new URL("../../../test-artifacts/console/", import.meta.url))
const shot = (page: Page, name: string) => page.screenshot({ path: join(artifacts, `${name}.png`), fullPage: true })

const ev = (seq: number, phase: string, at: number) => ({ seq, kind: "phase", phase, at })
const longDigest = `library/some-really-long-repository-name:1.2.3-bookworm@sha256:${"ab".repeat(32)}`

describe.skipIf(!haveChromium)("operator console in headless Chromium (SQLite file)", { timeout: 120_000 }, () => {
  const db = sqliteFile()
  let s: Running
  let browser: Browser
  let ctx: BrowserContext
  let device: { id: number; token: string }
  let active: any
  beforeAll(async () => {
    mkdirSync(artifacts, { recursive: true })
    s = await start({ sweepIntervalMs: 100, storeLayer: Database.layer(db.url) })
    browser = await chromium.launch({
      executablePath: chromiumPath,
      args: ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]
    })
    // A long failure backoff, so the failed target stays failed until the operator requeues it.
    const doc: Config.ManagedConfig = { ...Config.defaults, sources: { ...Config.defaults.sources, github: { ...Config.defaults.sources.github, failureBackoff: { initialSeconds: 86_400, maxSeconds: 86_400, maxRedrives: 1 } } } }
    expect((await s.admin("POST", "/v1/admin/config/apply", doc)).status).toBe(201)
    device = await s.addDevice("console-device", 2)
    const now = Date.now()
    await s.run(Effect.suspend(() => s.store.recordObservations([{ source: "github", identity: "acme/broken", remoteAt: now - 60_000 }], now)))
    const f = (await s.device(device.token, "POST", "/v1/assignments/claim", { slot: 0 })).body.assignment
    await s.device(device.token, "POST", `/v1/assignments/${f.reservationId}/result`, { fence: f.fence, outcome: "scan_error", finalPhase: "scanning", findings: [] })
    await s.run(Effect.suspend(() => s.store.recordObservations([{ source: "dockerhub", identity: longDigest, remoteAt: null }], now)))
    active = (await s.device(device.token, "POST", "/v1/assignments/claim", { slot: 1 })).body.assignment
    // 2 s preparing, 6 s acquiring, then scanning (open)
    await s.device(device.token, "POST", `/v1/assignments/${active.reservationId}/progress`, {
      fence: active.fence,
      events: [ev(1, "assigned", now - 10_000), ev(2, "preparing", now - 10_000), ev(3, "acquiring", now - 8000), ev(4, "scanning", now - 2000)]
    })
    ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } })
    const page = await ctx.newPage()
    await page.goto(`${s.url}/?token=${adminToken}`)
    await page.close()
  })
  afterAll(async () => {
    await ctx?.close()
    await browser?.close()
    await s?.close()
    db.cleanup()
  })

  it("without a session the console answers 401 and shows nothing", async () => {
    const c = await browser.newContext()
    const page = await c.newPage()
    const res = await page.goto(`${s.url}/console/targets`)
    expect(res?.status()).toBe(401)
    expect(await page.getByTestId("auth-error").isVisible()).toBe(true)
    expect(await page.getByTestId("targets-results").count()).toBe(0)
    await c.close()
  })

  it("search a target, open it: its assignment shows the timeline bar and the three labelled deadlines; the identity is truncated with its full value on hover", async () => {
    const page = await ctx.newPage()
    await page.goto(`${s.url}/`)
    await page.getByTestId("nav-targets").click()
    await page.getByTestId("target-search-prefix").fill("library/some-really")
    await page.getByTestId("target-search-submit").click()
    const cell = page.locator("[data-testid=targets-results] .id")
    expect(await cell.count()).toBe(1)
    expect(await cell.getAttribute("title")).toBe(`dockerhub:${longDigest}`)
    // cut to its column: the box is narrower than the text it holds
    expect(await cell.evaluate((e) => e.scrollWidth > e.clientWidth)).toBe(true)
    await shot(page, "search")
    await cell.click()
    expect(await page.getByTestId("target-status").textContent()).toBe("in_progress")
    const id = active.reservationId
    const labels = await page.locator(`[data-testid=assignment-${id}-deadlines] th`).allTextContents()
    expect(labels).toEqual(["Target-scan deadline", "Result-upload deadline", "Assignment expiry"])
    expect(await page.getByTestId(`assignment-${id}-target-scan-deadline-at`).textContent()).toBe(active.deadlines.targetScan.iso)
    expect(await page.getByTestId(`assignment-${id}-assignment-expiry-at`).textContent()).toBe(active.deadlines.assignmentExpiry.iso)
    expect(await page.getByTestId(`assignment-${id}-target-scan-deadline`).getAttribute("class")).toBe("next")
    // The bar: one segment per phase, widths in proportion to the time spent in each.
    const segs = page.locator(`[data-testid=timeline-${id}] span`)
    expect(await segs.evaluateAll((es) => es.map((e) => e.getAttribute("data-phase")))).toEqual(["assigned", "preparing", "acquiring", "scanning"])
    const widths = await segs.evaluateAll((es) => es.map((e) => e.getBoundingClientRect().width))
    expect(widths[2] / widths[1]).toBeGreaterThan(2.5) // 6 s acquiring against 2 s preparing
    expect(widths[2] / widths[1]).toBeLessThan(3.5)
    expect(await segs.nth(2).getAttribute("title")).toBe("acquiring: 6.0 s")
    await shot(page, "assignment")
    await page.close()
  })

  it("requeue a failed target and cancel an active assignment from the console; the device's next write is refused", async () => {
    const page = await ctx.newPage()
    await page.goto(`${s.url}/console/targets?status=failed`)
    await page.locator("[data-testid=targets-results] a").first().click()
    expect(await page.getByTestId("target-status").textContent()).toBe("failed")
    await page.getByTestId("requeue-reason").fill("scanner fixed")
    await page.getByTestId("requeue-submit").click()
    expect(await page.getByTestId("notice").textContent()).toBe("requeued github:acme/broken")
    expect(await page.getByTestId("target-status").textContent()).toBe("pending")
    await shot(page, "requeued")

    const id = active.reservationId
    await page.goto(`${s.url}/console/target?source=dockerhub&identity=${encodeURIComponent(longDigest)}`)
    await page.getByTestId(`cancel-${id}-reason`).fill("runaway scan")
    await page.getByTestId(`cancel-${id}-submit`).click()
    expect(await page.getByTestId("notice").textContent()).toBe(`cancelled reservation ${id}`)
    expect(await page.getByTestId(`assignment-${id}-state`).textContent()).toBe("released")
    expect(await page.getByTestId(`assignment-${id}-cancellation`).textContent()).toContain("Cancelled by dashboard")
    const refused = await s.device(device.token, "POST", `/v1/assignments/${id}/progress`, { fence: active.fence, events: [ev(5, "filtering", Date.now())] })
    expect(refused.status).toBe(403)
    expect(refused.body.error).toBe("reservation_refused:cancelled")
    const audit = (await s.admin("GET", "/v1/admin/audit?limit=2")).body.entries
    expect(audit.map((e: any) => [e.action, e.who, e.why])).toEqual([
      ["cancel", "dashboard", "runaway scan"],
      ["requeue", "dashboard", "scanner fixed"]
    ])
    await shot(page, "cancelled")
    await page.close()
  })

  it("set a priority from the console: the next claim takes that target ahead of an older pending one; out of range is refused with its reason and changes nothing", async () => {
    const page = await ctx.newPage()
    await page.goto(`${s.url}/console/targets?source=dockerhub`)
    await page.locator("[data-testid=targets-results] a").first().click()
    expect(await page.getByTestId("target-status").textContent()).toBe("pending")
    expect(await page.getByTestId("target-priority").textContent()).toBe("0")
    await page.getByTestId("priority-value").fill("7")
    await page.getByTestId("priority-reason").fill("release blocker")
    await page.getByTestId("priority-submit").click()
    expect(await page.getByTestId("notice").textContent()).toBe(`set the priority of dockerhub:${longDigest} to 7`)
    expect(await page.getByTestId("target-priority").textContent()).toBe("7")
    await shot(page, "priority")
    // The browser keeps the field in range; a request past it (with the page's own CSRF token) is refused by the store's rule.
    const csrf = await page.locator("[data-testid=priority] input[name=csrf]").getAttribute("value")
    const back = `/console/target?${new URLSearchParams({ source: "dockerhub", identity: longDigest })}`
    const res = await ctx.request.post(`${s.url}/console/actions/priority`, { form: { csrf: csrf!, back, reason: "x", source: "dockerhub", identity: longDigest, priority: "500" }, maxRedirects: 0 })
    expect(res.status()).toBe(303)
    expect(new URL(res.headers().location ?? "", s.url).searchParams.get("refused")).toBe("priority 500 is not an integer in [-100, 100]")
    expect((await s.admin("GET", `/v1/admin/targets/inspect?source=dockerhub&identity=${encodeURIComponent(longDigest)}`)).body.target.priority).toBe(7)
    expect((await s.admin("GET", "/v1/admin/audit?limit=1")).body.entries[0]).toMatchObject({ action: "set_priority", who: "dashboard", why: "release blocker", detail: { from: 0, to: 7 } })
    // acme/broken (requeued above) is older and pending too: the priority takes the dockerhub target first
    const next = (await s.device(device.token, "POST", "/v1/assignments/claim", { slot: 0 })).body.assignment
    expect(next.target.identity).toBe(longDigest)
    await s.device(device.token, "POST", `/v1/assignments/${next.reservationId}/release`, { fence: next.fence })
    await page.close()
  })

  it("charts of outcomes and promotions over time and of percentiles per window are drawn from the server's own uPlot, over tables of the same numbers", async () => {
    const page = await ctx.newPage()
    const errors: Array<string> = []
    page.on("pageerror", (e) => errors.push(e.message))
    page.on("console", (m) => m.type() === "error" && errors.push(m.text()))
    const requests: Array<string> = []
    page.on("request", (r) => requests.push(r.url()))
    await page.goto(`${s.url}/console/charts`)
    await page.waitForSelector("[data-testid=chart-outcomes][data-drawn=true] canvas")
    await page.waitForSelector("[data-testid=chart-percentiles][data-drawn=true] canvas")
    expect(errors).toEqual([])
    // Nothing from another origin.
    expect(requests.every((u) => u.startsWith(s.url))).toBe(true)
    const rows = await page.locator("[data-testid=chart-outcomes-table] tbody tr").count()
    expect(rows).toBe(24)
    // The failed (scan_error) and cancelled results of the earlier tests are in the table: each counted once.
    const cells = await page.locator("[data-testid=chart-outcomes-table] tbody tr td").allTextContents()
    const sum = (col: number) => cells.filter((_, i) => i % 6 === col).reduce((n, c) => n + Number(c), 0)
    expect(sum(3)).toBe(1)
    await shot(page, "charts")
    await page.close()
  })

  it("percentiles per window: p50/p95/p99 of one group in consecutive hourly windows, the busiest group by default, another chosen from the page; thin windows insufficient", async () => {
    const now = Date.now()
    const at = (t: number, base: number, n: number) => Array.from({ length: n }, (_, i) => ({ source: "dockerhub" as const, metric: "scanning" as const, outcome: "clean" as const, ms: base + i * 37, at: t }))
    const earlier = now - 3 * 3_600_000
    const thin = now - 5 * 3_600_000
    await s.run(Effect.suspend(() => s.store.recordDurations([...at(now - 1000, 1000, 25), ...at(earlier, 5000, 25), ...at(thin, 9000, 3)])))
    const hour = (t: number) => `${new Date(t).toISOString().slice(0, 13)}:00`
    const page = await ctx.newPage()
    const errors: Array<string> = []
    page.on("pageerror", (e) => errors.push(e.message))
    await page.goto(`${s.url}/console/charts`)
    await page.waitForSelector("[data-testid=chart-percentiles][data-drawn=true] canvas")
    expect(errors).toEqual([])
    // 53 samples: the busiest group of the span is chosen without asking
    expect(await page.getByTestId("chart-percentiles-title").textContent()).toBe("p50, p95 and p99 of scanning for dockerhub / clean, per hour over the last 24 h")
    expect(await page.locator("[data-testid=chart-percentiles-table] tbody tr").count()).toBe(24)
    const row = async (t: number) => (await page.getByTestId(`chart-window-${hour(t)}`).locator("td").allTextContents()).slice(1)
    const seconds = (c: string) => Number(c.replace(" s", ""))
    const [nowCount, nowP50] = await row(now - 1000)
    expect(nowCount).toBe("25")
    expect(seconds(nowP50)).toBeGreaterThan(0.9)
    expect(seconds(nowP50)).toBeLessThan(1.9)
    const [thenCount, thenP50, , thenP99] = await row(earlier)
    expect(thenCount).toBe("25")
    expect(seconds(thenP50)).toBeGreaterThan(4.9)
    expect(seconds(thenP50)).toBeLessThan(5.9)
    expect(seconds(thenP99)).toBeGreaterThanOrEqual(seconds(thenP50))
    expect(await row(thin)).toEqual(["3", "insufficient (3 of 20 samples)", "insufficient (3 of 20 samples)", "insufficient (3 of 20 samples)"])
    // the chart carries the same numbers: one point per window, a gap where a window is insufficient
    const data = JSON.parse((await page.getByTestId("chart-percentiles").getAttribute("data-chart"))!)
    expect(data.x).toHaveLength(24)
    expect(data.series.map((x: any) => x.label)).toEqual(["p50 (s)", "p95 (s)", "p99 (s)"])
    expect(data.series[0].values.filter((v: number | null) => v !== null)).toHaveLength(2)
    // another group, chosen from the form: its own windows
    await page.getByTestId("chart-metric").selectOption("end_to_end")
    await page.getByTestId("chart-source").selectOption("github")
    await page.getByTestId("chart-outcome").selectOption("scan_error")
    await page.getByTestId("chart-percentiles-submit").click()
    await page.waitForSelector("[data-testid=chart-percentiles][data-drawn=true] canvas")
    expect(await page.getByTestId("chart-percentiles-title").textContent()).toBe("p50, p95 and p99 of end_to_end for github / scan_error, per hour over the last 24 h")
    const counts = await page.locator("[data-testid=chart-percentiles-table] tbody tr td:nth-child(2)").allTextContents()
    expect(counts.reduce((n, c) => n + Number(c), 0)).toBe(1) // the one scan_error result of acme/broken
    await page.getByTestId("chart-span").selectOption("7d")
    await page.getByTestId("chart-percentiles-submit").click()
    expect(await page.locator("[data-testid=chart-percentiles-table] tbody tr").count()).toBe(28)
    await shot(page, "percentiles")
    await page.close()
  })

  it("pause and resume a source; a form without the session's CSRF token is refused and changes nothing", async () => {
    const page = await ctx.newPage()
    await page.goto(`${s.url}/`)
    await page.getByTestId("nav-sources").click()
    await page.getByTestId("pause-gitlab-reason").fill("rate limited")
    await page.getByTestId("pause-gitlab-submit").click()
    expect(await page.getByTestId("source-gitlab-state").textContent()).toBe("paused")
    expect((await s.admin("GET", "/v1/admin/sources")).body.sources.find((c: any) => c.source === "gitlab")).toMatchObject({ paused: true, pausedBy: "dashboard", reason: "rate limited" })
    await shot(page, "paused")
    // A forged form (the session cookie rides along, the CSRF token does not match): 403, nothing changed.
    // (The page's own policy forbids script requests, so the forgery is sent with the context's cookies from outside.)
    const forged = (await ctx.request.post(`${s.url}/console/actions/resume`, { form: { csrf: "forged", back: "/console/sources", reason: "x", source: "gitlab" }, maxRedirects: 0 })).status()
    const missing = (await ctx.request.post(`${s.url}/console/actions/resume`, { form: { back: "/console/sources", reason: "x", source: "gitlab" }, maxRedirects: 0 })).status()
    expect(missing).toBe(403)
    expect(forged).toBe(403)
    expect((await s.admin("GET", "/v1/admin/sources")).body.sources.find((c: any) => c.source === "gitlab").paused).toBe(true)
    await page.getByTestId("resume-gitlab-reason").fill("quota back")
    await page.getByTestId("resume-gitlab-submit").click()
    expect(await page.getByTestId("source-gitlab-state").textContent()).toBe("running")
    await page.close()
  })

  it("the device list shows each device's containment level as its worker reported it at registration, with its active reservations", async () => {
    expect((await s.device(device.token, "POST", "/v1/device/register", { containment: "cgroup-v2" })).status).toBe(200)
    const quiet = await s.addDevice("never-started", 1)
    const page = await ctx.newPage()
    await page.goto(`${s.url}/`)
    await page.getByTestId("nav-devices").click()
    expect(await page.getByTestId(`device-${device.id}-containment`).textContent()).toBe("cgroup-v2")
    // The page lists what the admin API does (the earlier test cancelled the active assignment).
    const listed = (await s.admin("GET", "/v1/admin/devices")).body.devices.find((d: any) => d.id === device.id)
    expect(listed.containment).toBe("cgroup-v2")
    expect(await page.getByTestId(`device-${device.id}-active`).textContent()).toBe(
      listed.active.length === 0 ? "none" : listed.active.map((a: any) => `${a.reservationId} (slot ${a.slot})`).join(", ")
    )
    expect(await page.getByTestId(`device-${quiet.id}-containment`).textContent()).toBe("not reported yet")
    expect(await page.getByTestId(`device-${quiet.id}-state`).textContent()).toBe("live")
    await shot(page, "devices")
    await page.close()
  })
})
