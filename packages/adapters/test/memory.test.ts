import { MemoryStore } from "@scanfleet/core"
import { conformance } from "../src/Conformance.js"

conformance("memory (core's reference model)", () => MemoryStore.layer, { concurrency: false, modelRuns: 5 })
