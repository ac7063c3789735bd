import { Errors } from "@scanfleet/core"
import { Effect, Logger } from "effect"
import { describe, expect, it } from "vitest"
import { ApiError, fromStoreError, toResponse } from "../src/ApiError.js"
import * as Server from "../src/Server.js"

/**
 * A refusal by the store reaches the client as its status and error body, and the server's log
 * with what the store said; the client's own mistakes are not logged beyond the access line.
 */
const logged = async (e: ApiError) => {
  const lines: Array<{ message: unknown; level: string; annotations: Record<string, unknown> }> = []
  const logger = Logger.make(({ message, logLevel, annotations }) => lines.push({ message, level: logLevel.label, annotations: Object.fromEntries(annotations) }))
  const res = await Effect.runPromise(Server.refused(e).pipe(Effect.provide(Logger.replace(Logger.defaultLogger, logger))))
  return { res, lines }
}

describe("store refusals", () => {
  it("every store reason is answered with its status (the database's words only in store_invalid) and logged once with them", async () => {
    const said = "could not connect to server: Connection refused (db.internal:5432)"
    for (const reason of ["unavailable", "full", "conflict", "invalid", "constraint", "corrupt", "internal"] as const) {
      const e = fromStoreError(new Errors.StoreError({ reason, message: said }))
      const { res, lines } = await logged(e)
      expect(res.status).toBe(toResponse(e).status)
      // only store_invalid quotes the database (which value it refused), cut to 200 characters
      if (reason !== "invalid") expect(JSON.stringify(toResponse(e).body), reason).not.toContain("db.internal")
      expect(lines.map((l) => [l.level, l.message, l.annotations.error]), reason).toEqual([["WARN", ["the store refused a request"], e.error]])
      expect(String(lines[0].annotations.detail)).toBe(`${reason}: ${said}`)
    }
  })

  it("a refusal of the client's input is answered and not logged", async () => {
    const { res, lines } = await logged(new ApiError({ status: 400, error: "invalid_body", message: "x" }))
    expect(res.status).toBe(400)
    expect(lines).toEqual([])
  })
})
