import { afterAll, beforeAll, inject } from "vitest"
import * as Database from "../src/Database.js"
import { pgDatabase, pgQuery } from "./fixtures/Databases.js"
import { filesUnder, findingsSuite } from "./fixtures/FindingsSuite.js"

let db: Awaited<ReturnType<typeof pgDatabase>>
beforeAll(async () => {
  db = await pgDatabase(inject("pgUrl"))
})
afterAll(() => db?.cleanup())

const query = <R>(url: string, text: string): Promise<Array<R>> => pgQuery<R>(url, text)

findingsSuite(
  "PostgreSQL",
  {
    layer: () => Database.layer(db.url),
    // Postgres compresses long values; stored uncompressed, a planted value would show in the data files
    prepare: async () => {
      for (const [table, column] of [["assignments", "result_body"], ["findings", "details"], ["findings", "sealed"], ["finding_outbox", "payload"]])
        await query(db.url, `ALTER TABLE ${table} ALTER COLUMN ${column} SET STORAGE EXTERNAL`)
    },
    // every file of the cluster (heap, indexes, TOAST, pg_wal) after a checkpoint wrote the buffers out
    files: async () => {
      await query(inject("pgUrl"), "CHECKPOINT")
      const [{ data_directory }] = await query<{ data_directory: string }>(inject("pgUrl"), "SHOW data_directory")
      return filesUnder(data_directory)
    },
    sealed: async () => (await query<{ sealed: string }>(db.url, "SELECT sealed FROM findings WHERE sealed IS NOT NULL")).map((r) => r.sealed)
  },
  { runs: 12 }
)
