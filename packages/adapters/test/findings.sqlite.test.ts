import { findingConformance } from "../src/Conformance.js"
import { freshStore } from "./support/TempSqlite.js"

findingConformance("sqlite (a temporary file)", freshStore, { modelRuns: 8 })
