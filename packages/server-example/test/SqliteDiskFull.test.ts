import { Store } from "@scanfleet/core"
import { Effect } from "effect"
import { execFileSync } from "node:child_process"
import { closeSync, mkdtempSync, openSync, rmSync, unlinkSync, writeSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Database from "../src/Database.js"
import { start, type Running } from "./fixtures/Harness.js"

/**
 * A SQLite file on a small tmpfs that fills up: a write the disk cannot take is
 * answered 503 `store_full` with `Retry-After`, never a 500, changes nothing, and
 * the same request succeeds once there is room again.
 */
describe("SQLite on a full disk (a 4 MiB tmpfs)", () => {
  const dir = mkdtempSync(join(tmpdir(), "scanfleet-full-"))
  const filler = join(dir, "filler")
  let s: Running
  let token = ""

  beforeAll(async () => {
    // Root can mount; a failure here fails the suite rather than skipping it.
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=4m", "tmpfs", dir])
    s = await start({ storeLayer: Database.layer(`sqlite:${join(dir, "scanfleet.db")}`) })
    token = (await s.addDevice("full", 4)).token
    await s.run(Effect.flatMap(Store.Store, (st) => st.recordObservations(Array.from({ length: 8 }, (_, i) => ({ source: "github" as const, identity: `full/${i}`, remoteAt: null })), Date.now())))
  })
  afterAll(async () => {
    await s?.close()
    execFileSync("umount", [dir])
    rmSync(dir, { recursive: true, force: true })
  })

  /** Fills the file system to its last byte. */
  const fill = () => {
    const fd = openSync(filler, "w")
    const chunk = Buffer.alloc(64 * 1024, 1)
    try {
      for (;;) writeSync(fd, chunk)
    } catch (e) {
      expect((e as NodeJS.ErrnoException).code).toBe("ENOSPC")
      // the last partial chunk
      try {
        for (;;) writeSync(fd, Buffer.alloc(512, 1))
      } catch {
        // full
      }
    } finally {
      closeSync(fd)
    }
  }

  it("a result that does not fit is 503 store_full with Retry-After and changes nothing; after space is freed the same upload is accepted once", async () => {
    const c = await s.device(token, "POST", "/v1/assignments/claim", { slot: 0 })
    expect(c.status).toBe(200)
    const a = c.body.assignment
    // About 900 KB of (redacted) findings: far more than the WAL holds already; their rows must roll back with the result.
    const findings = Array.from({ length: 14 }, (_, i) => ({
      scanner: "custom",
      detector: `r${i}`,
      path: "f",
      fingerprint: `hmac-sha256:${String(i % 10).repeat(64)}`,
      preview: "",
      details: { text: String.fromCharCode(97 + i).repeat(64_000) }
    }))
    const body = { fence: a.fence, outcome: "findings", finalPhase: "staging", findings, log: "" }
    fill()
    const res = await fetch(`${s.url}/v1/assignments/${a.reservationId}/result`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify(body)
    })
    const refused = (await res.json()) as { error: string }
    expect(res.status, JSON.stringify(refused)).toBe(503)
    expect(refused.error).toBe("store_full")
    expect(Number(res.headers.get("retry-after"))).toBeGreaterThan(0)
    // Reads still work on a full disk, and the refused upload left the reservation as it was.
    const view = await s.device(token, "GET", `/v1/assignments/${a.reservationId}`)
    expect(view.status).toBe(200)
    expect(view.body.state).toBe("active")
    unlinkSync(filler)
    const retried = await s.device(token, "POST", `/v1/assignments/${a.reservationId}/result`, body)
    expect(retried.status, JSON.stringify(retried.body)).toBe(200)
    const again = await s.device(token, "POST", `/v1/assignments/${a.reservationId}/result`, body)
    expect(again.body).toEqual(retried.body)
    const done = await s.device(token, "GET", `/v1/assignments/${a.reservationId}`)
    expect(done.body.state).toBe("completed")
  })
})
