import { afterAll } from "vitest"
import * as Database from "../src/Database.js"
import { sqliteFile } from "./fixtures/Databases.js"
import { operationsSuite } from "./fixtures/OperationsSuite.js"

const db = sqliteFile()
afterAll(() => db.cleanup())

operationsSuite("SQLite file", () => Database.layer(db.url))
