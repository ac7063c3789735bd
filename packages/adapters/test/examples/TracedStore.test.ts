import { Layer } from "effect"
import { MemoryStore } from "@scanfleet/core"
import { conformance } from "@scanfleet/adapters/Conformance"
import * as TracedStore from "./TracedStore.js"

conformance("traced memory store (example adapter)", () => TracedStore.layer.pipe(Layer.provide(MemoryStore.layer)), {
  concurrency: false,
  modelRuns: 3
})
