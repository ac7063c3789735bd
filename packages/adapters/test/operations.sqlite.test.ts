import { operationsConformance } from "../src/Conformance.js"
import { freshStore } from "./support/TempSqlite.js"

operationsConformance("sqlite (a temporary file)", freshStore, { concurrency: false })
