import { Effect } from "effect"
import { MemoryStore } from "@scanfleet/core"
import { suite } from "./fixtures/DiscoverySuite.js"

// The in-memory reference store: both handles are the same store, each call atomic.
suite(
  "MemoryStore",
  Effect.sync(() => {
    const store = MemoryStore.make()
    return { primary: store, secondary: store }
  })
)
