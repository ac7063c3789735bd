import { conformance } from "../src/Conformance.js"
import { freshStore } from "./support/TempSqlite.js"

conformance("sqlite (a temporary file)", freshStore, { concurrency: false })
