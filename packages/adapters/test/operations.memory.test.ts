import { MemoryStore } from "@scanfleet/core"
import { operationsConformance } from "../src/Conformance.js"

operationsConformance("memory (core's reference model)", () => MemoryStore.layer, { concurrency: false, modelRuns: 20 })
