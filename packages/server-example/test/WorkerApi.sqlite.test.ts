import { afterAll } from "vitest"
import * as Database from "../src/Database.js"
import { sqliteFile } from "./fixtures/Databases.js"
import { suite } from "./fixtures/WorkerApiSuite.js"

const db = sqliteFile()
afterAll(() => db.cleanup())

suite("SQLite file", () => Database.layer(db.url))
