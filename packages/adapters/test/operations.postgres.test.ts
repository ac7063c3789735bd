import { inject } from "vitest"
import { operationsConformance } from "../src/Conformance.js"
import { freshStore } from "./support/PgSchema.js"

operationsConformance("postgres (a fresh schema per test)", () => freshStore(inject("pgUrl")), { concurrency: true, modelRuns: 5 })
