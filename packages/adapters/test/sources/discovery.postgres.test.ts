import { inject } from "vitest"
import { suite } from "./fixtures/DiscoverySuite.js"
import { postgres } from "./fixtures/SqlStores.js"

// A database of its own per test; the concurrent cycles use two pools, as two server processes would.
suite("PgStore", postgres(inject("pgUrl")))
