import { FindingStore } from "@scanfleet/core"
import { findingConformance } from "../src/Conformance.js"

findingConformance("memory (core's reference model)", () => FindingStore.layerMemory, { modelRuns: 3 })
