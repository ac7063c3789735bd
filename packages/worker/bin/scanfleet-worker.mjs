#!/usr/bin/env node
// The scanfleet-worker command. It is committed (not built) so npm can link it
// in a fresh clone before anything is built; the code it runs is the build.
import { existsSync } from "node:fs"

const entry = new URL("../dist/bin.js", import.meta.url)
if (!existsSync(entry)) {
  process.stderr.write("scanfleet-worker: the build is missing (dist/bin.js); in a clone run `npm run build` (npm ci runs it)\n")
  process.exit(1)
}
await import(entry.href)
