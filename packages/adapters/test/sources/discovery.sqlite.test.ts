import { suite } from "./fixtures/DiscoverySuite.js"
import { sqlite } from "./fixtures/SqlStores.js"

// Two connections to one SQLite file: the concurrent cycles race through the file lock.
suite("SqliteStore", sqlite)
