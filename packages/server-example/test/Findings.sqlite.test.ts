import SqliteDatabase from "better-sqlite3"
import { afterAll } from "vitest"
import * as Database from "../src/Database.js"
import { sqliteFile } from "./fixtures/Databases.js"
import { findingsSuite } from "./fixtures/FindingsSuite.js"

const db = sqliteFile()
const path = db.url.slice("sqlite:".length)
afterAll(() => db.cleanup())

findingsSuite(
  "SQLite file",
  {
    layer: () => Database.layer(db.url),
    // the database file, its WAL and shared memory as they are now: no checkpoint, so the WAL's pages are searched as written
    files: async () => [path, `${path}-wal`, `${path}-shm`],
    sealed: async () => {
      const c = new SqliteDatabase(path, { readonly: true })
      try {
        return (c.prepare("SELECT sealed FROM findings WHERE sealed IS NOT NULL").all() as Array<{ sealed: string }>).map((r) => r.sealed)
      } finally {
        c.close()
      }
    }
  },
  { runs: 25 }
)
