import { describe, expect, it } from "@effect/vitest"
import { AdminApi, FindingsApi } from "@scanfleet/core"

// Both query fields that take an instant read it by one rule (core's RemoteTimestamp.parseQueryInstant).
const fields = [
  ["since", (v: string) => FindingsApi.ListQuery.safeParse({ since: v })],
  ["changedSince", (v: string) => AdminApi.TargetSearchQuery.safeParse({ changedSince: v })]
] as const

describe("query-string instants: findings' since and targets' changedSince", () => {
  it("accept epoch milliseconds up to the latest Date, a date, and ISO-8601 instants with their offset", () => {
    for (const [v, ms] of [
      ["0", 0],
      ["1735689600000", 1735689600000],
      ["8640000000000000", 8.64e15],
      ["2025-01-01", Date.UTC(2025, 0, 1)],
      ["2024-02-29", Date.UTC(2024, 1, 29)],
      ["2025-01-01T10:00Z", Date.UTC(2025, 0, 1, 10)],
      ["2025-01-01T10:00:00Z", Date.UTC(2025, 0, 1, 10)],
      ["2025-01-01T10:00:00.123Z", Date.UTC(2025, 0, 1, 10, 0, 0, 123)],
      ["2025-01-01T12:00:00+02:00", Date.UTC(2025, 0, 1, 10)],
      ["2025-01-01T05:30:00-04:30", Date.UTC(2025, 0, 1, 10)],
      // the variants every ISO-8601 timestamp the project reads may take (RemoteTimestamp.parseInstant)
      ["2025-01-01 10:00:00Z", Date.UTC(2025, 0, 1, 10)],
      ["2025-01-01t10:00:00z", Date.UTC(2025, 0, 1, 10)],
      ["2025-01-01T12:00:00+0200", Date.UTC(2025, 0, 1, 10)]
    ] as const) {
      for (const [field, parse] of fields) {
        const r = parse(v)
        expect(r.success, `${field}=${v}`).toBe(true)
        expect((r.data as Record<string, unknown> | undefined)?.[field], `${field}=${v}`).toBe(ms)
      }
    }
    expect(FindingsApi.ExportQuery.parse({ since: "2025-01-01T10:00:00Z" }).since).toBe(Date.UTC(2025, 0, 1, 10))
  })

  it("refuse anything else, naming the field", () => {
    for (const v of [
      "",
      "-1",
      "x 1",
      "March 7",
      "\u0000",
      "%00",
      " 1",
      "1 ",
      "1e3",
      "0x10",
      "1.5",
      "+1",
      "8640000000000001",
      "99999999999999999999",
      "9".repeat(400),
      "2025 ",
      "2025-01",
      "2025-1-1",
      "2025-02-29",
      "2025-02-30",
      "2025-13-01",
      "2025-01-32",
      "2025-01-01T10:00:00",
      "2025-01-01T10:00",
      "2025-01-01T24:00:00Z",
      "2025-01-01T10:60:00Z",
      "2025-01-01T10:00:60Z",
      "2025-01-01T10:00:00+02",
      "2025-01-01T10:00:00+24:00",
      "2025-01-01T10:00:00.Z",
      "2025-01-01T10:00:00.1234567890Z",
      "2025-01-01Z",
      "+275760-09-13T00:00:00Z",
      "Wed, 01 Jan 2025 10:00:00 GMT",
      "2025-01-01T10:00:00Zjunk",
      " 2025-01-01T10:00:00Z"
    ]) {
      for (const [field, parse] of fields) {
        const r = parse(v)
        expect(r.success, `${field}=${JSON.stringify(v)}`).toBe(false)
        expect(r.error?.issues.map((i) => i.path), `${field}=${JSON.stringify(v)}`).toEqual([[field]])
        expect(r.error?.issues[0].message).toMatch(/epoch milliseconds.* ISO-8601 instant with its offset/)
      }
      expect(FindingsApi.ExportQuery.safeParse({ since: v }).success, JSON.stringify(v)).toBe(false)
    }
  })
})

describe("a findings query names any stored identity", () => {
  it("up to 1,024 characters (a stored identity is at most 1,024 bytes); past that it is refused at the field", () => {
    for (const identity of ["i".repeat(1024), "\u00e9".repeat(512)]) {
      expect(FindingsApi.TargetQuery.safeParse({ source: "gitlab", identity }).success).toBe(true)
      expect(FindingsApi.ListQuery.safeParse({ identity }).success).toBe(true)
    }
    const over = FindingsApi.TargetQuery.safeParse({ source: "gitlab", identity: "i".repeat(1025) })
    expect(over.success).toBe(false)
    expect(over.error?.issues[0].path).toEqual(["identity"])
  })
})
