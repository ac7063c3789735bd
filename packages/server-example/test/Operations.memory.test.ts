import { MemoryStore } from "@scanfleet/core"
import { operationsSuite } from "./fixtures/OperationsSuite.js"

operationsSuite("memory", () => MemoryStore.layer)
