import { MemoryStore } from "@scanfleet/core"
import { suite } from "./fixtures/WorkerApiSuite.js"

suite("memory", () => MemoryStore.layer)
