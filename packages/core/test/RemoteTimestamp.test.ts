import { describe, expect, it } from "@effect/vitest"
import { FastCheck as fc } from "effect"
import { Promotion, RemoteTimestamp, Source, Target } from "@scanfleet/core"
import { completedTarget, junk, T0 } from "./fixtures/arbitraries.js"

const now = T0
const { notBefore, maxSkewMs } = RemoteTimestamp.defaultBounds

/** An instant inside the default bounds at millisecond precision. */
const validInstant = fc.integer({ min: notBefore, max: now + maxSkewMs })
/** An offset in minutes as sites write them (−12:00 … +14:00). */
const offsetMinutes = fc.integer({ min: -12 * 60, max: 14 * 60 })

const pad = (n: number, w = 2) => String(Math.abs(n)).padStart(w, "0")

/** Writes an instant as local time at the given offset, the way a source API might. */
const format = (ms: number, offMin: number, fracDigits: number): string => {
  const local = new Date(ms + offMin * 60_000)
  const frac = fracDigits === 0 ? "" : "." + pad(local.getUTCMilliseconds(), 3).padEnd(fracDigits, "0").slice(0, fracDigits)
  const off = offMin === 0 ? "Z" : `${offMin < 0 ? "-" : "+"}${pad(Math.floor(Math.abs(offMin) / 60))}:${pad(Math.abs(offMin) % 60)}`
  return (
    `${pad(local.getUTCFullYear(), 4)}-${pad(local.getUTCMonth() + 1)}-${pad(local.getUTCDate())}` +
    `T${pad(local.getUTCHours())}:${pad(local.getUTCMinutes())}:${pad(local.getUTCSeconds())}${frac}${off}`
  )
}

describe("RemoteTimestamp", () => {
  it.prop("malformed timestamps never throw and never promote", [fc.constantFrom(...Source.sources), junk, completedTarget], ([source, raw, t]) => {
    const remoteAt = RemoteTimestamp.normalize(source, raw, now) ?? null
    if (remoteAt !== null) {
      // Whatever is accepted must be a real instant inside the bounds.
      expect(Number.isInteger(remoteAt)).toBe(true)
      expect(remoteAt).toBeGreaterThanOrEqual(notBefore)
      expect(remoteAt).toBeLessThanOrEqual(now + maxSkewMs)
      return
    }
    // "No valid timestamp" recorded on a completed target that had none never makes it eligible.
    const seen = Target.observe({ ...t, observedRemoteAt: null }, { source: t.source, identity: t.identity, remoteAt })
    expect(Promotion.decide(seen, { cooldownMs: 0 }, now + 1e12)).toEqual({ _tag: "skip", reason: "no_valid_timestamp" })
  })

  it.prop("a valid instant written at any explicit offset normalises to the same UTC millisecond", [validInstant, offsetMinutes, fc.constantFrom(0, 3, 6, 9)], ([ms, off, digits]) => {
    const raw = format(ms, off, digits)
    const expected = digits === 0 ? ms - (((ms % 1000) + 1000) % 1000) : ms
    expect(RemoteTimestamp.parseInstant(raw)).toBe(expected)
    expect(RemoteTimestamp.normalize("github", raw, now)).toBe(expected)
  })

  it.prop("a normalised timestamp always lies inside the documented bounds", [fc.oneof(junk, validInstant.map((ms) => format(ms, 0, 3)), fc.integer({ min: 0, max: now * 2 }).map((ms) => format(ms, 60, 3))), fc.integer({ min: T0 - 1e10, max: T0 + 1e10 })], ([raw, at]) => {
    const t = RemoteTimestamp.normalize("gitlab", raw, at)
    if (t !== undefined) {
      expect(t).toBeGreaterThanOrEqual(notBefore)
      expect(t).toBeLessThanOrEqual(at + maxSkewMs)
    }
  })

  it.prop(
    "parseInstant reads every four-digit-year instant as the platform's Date does",
    [fc.date({ min: new Date("0000-01-01T00:00:00.000Z"), max: new Date("9999-12-31T23:59:59.999Z"), noInvalidDate: true })],
    ([d]) => {
      expect(RemoteTimestamp.parseInstant(d.toISOString())).toBe(d.getTime())
    },
    // Regression: seed -2108319695 found years 0–99 read as 1900–1999 (0099-12-31 became 1999-12-31).
    { fastCheck: { seed: -2108319695 } }
  )

  it.prop("a timestamp without an explicit offset is never valid", [validInstant], ([ms]) => {
    const local = format(ms, 0, 3).slice(0, -1)
    expect(RemoteTimestamp.normalize("github", local, now)).toBeUndefined()
  })

  it.prop("DockerHub records never carry a remote timestamp", [validInstant, offsetMinutes], ([ms, off]) => {
    const raw = format(ms, off, 3)
    expect(RemoteTimestamp.normalize("dockerhub", raw, now)).toBeUndefined()
    expect(RemoteTimestamp.fromRecord("dockerhub", { pushed_at: raw, last_updated: raw, lastModified: raw }, now)).toBeUndefined()
  })

  it.prop("each source is read from its own field and no other", [validInstant], ([ms]) => {
    const raw = format(ms, 0, 3)
    const record = (field: string) => ({ [field]: raw, created_at: raw, createdAt: raw, updated_at: raw })
    expect(RemoteTimestamp.fromRecord("github", record("pushed_at"), now)).toBe(ms)
    expect(RemoteTimestamp.fromRecord("gitlab", record("last_activity_at"), now)).toBe(ms)
    expect(RemoteTimestamp.fromRecord("huggingface", record("lastModified"), now)).toBe(ms)
    expect(RemoteTimestamp.fromRecord("github", record("updated_at"), now)).toBeUndefined()
    expect(RemoteTimestamp.fromRecord("huggingface", record("createdAt"), now)).toBeUndefined()
  })

  it("the bounds are inclusive at 2000-01-01T00:00:00Z and at the allowed skew", () => {
    expect(RemoteTimestamp.normalize("github", "2000-01-01T00:00:00Z", now)).toBe(Date.UTC(2000, 0, 1))
    expect(RemoteTimestamp.normalize("github", "1999-12-31T23:59:59.999Z", now)).toBeUndefined()
    expect(RemoteTimestamp.normalize("github", "2025-01-01T00:05:00Z", now)).toBe(now + maxSkewMs)
    expect(RemoteTimestamp.normalize("github", "2025-01-01T00:05:00.001Z", now)).toBeUndefined()
    expect(RemoteTimestamp.normalize("github", "2024-02-29T12:00:00+02:00", now)).toBe(Date.UTC(2024, 1, 29, 10))
    expect(RemoteTimestamp.normalize("github", "2023-02-29T12:00:00Z", now)).toBeUndefined()
  })
})
