import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll } from "vitest"
import { bundle } from "./Controller.js"
import * as Unit from "./Unit.js"

/**
 * The set-up of a test file that runs real devices: a scratch folder of its
 * own (`scanfleet-<name>-…`, removed after the file), and the device CLI and
 * the execution unit bundled before its first test. Returns the folder.
 */
export const useDeviceScratch = (name: string): string => {
  const dir = mkdtempSync(join(tmpdir(), `scanfleet-${name}-`))
  afterAll(() => rmSync(dir, { recursive: true, force: true }))
  beforeAll(async () => {
    await Promise.all([bundle(), Unit.build()])
  }, 120_000)
  return dir
}
