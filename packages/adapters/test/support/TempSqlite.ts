import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { Errors, FindingStore, Operations, Store } from "@scanfleet/core"
import { Effect, Layer } from "effect"
import * as SqliteStore from "../../src/SqliteStore.js"

/** A SQLite Store in a fresh temporary file, deleted when the layer is released. */
export const freshStore = (): Layer.Layer<Store.Store | Operations.Operations | FindingStore.FindingStore, Errors.StoreError> =>
  Layer.unwrapScoped(
    Effect.map(
      Effect.acquireRelease(
        Effect.sync(() => mkdtempSync(join(tmpdir(), "scanfleet-sqlite-"))),
        (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
      ),
      (dir) => SqliteStore.layer({ filename: join(dir, "store.db") })
    )
  )
