import { inject } from "vitest"
import { findingConformance } from "../src/Conformance.js"
import { freshStore } from "./support/PgSchema.js"

findingConformance("postgres (a fresh schema per test)", () => freshStore(inject("pgUrl"), 4), { modelRuns: 6 })
