import { describe, expect, inject, it } from "vitest"
import pg from "pg"

describe("test PostgreSQL", () => {
  it("is reachable for every suite that needs it", async () => {
    const client = new pg.Client({ connectionString: inject("pgUrl") })
    await client.connect()
    const { rows } = await client.query("select 1 + 1 as two")
    await client.end()
    expect(rows[0].two).toBe(2)
  })
})
