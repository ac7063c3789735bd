import { inject } from "vitest"
import { conformance } from "../src/Conformance.js"
import { freshStore } from "./support/PgSchema.js"

conformance("postgres (a fresh schema per test)", () => freshStore(inject("pgUrl")), { concurrency: true, modelRuns: 6 })
