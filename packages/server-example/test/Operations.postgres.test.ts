import { Layer } from "effect"
import { afterAll, beforeAll, inject } from "vitest"
import * as Database from "../src/Database.js"
import { pgDatabase } from "./fixtures/Databases.js"
import { operationsSuite } from "./fixtures/OperationsSuite.js"

let db: Awaited<ReturnType<typeof pgDatabase>>
beforeAll(async () => {
  db = await pgDatabase(inject("pgUrl"))
})
afterAll(async () => {
  await db?.cleanup()
})

// Built lazily: the database exists only once beforeAll has run.
operationsSuite("PostgreSQL", () => Layer.suspend(() => Database.layer(db.url, { poolSize: 5 })))
