#!/usr/bin/env node
// The demo's scanner: secretlint (@secretlint/core with its recommended rule
// preset) over every file of a directory, one JSON line per message on stdout
// (the message with the file's path). Exit codes: 0 clean, 3 findings, 2 usage,
// 1 a file could not be scanned. With --slow-marker M --identity I, an identity
// containing M sleeps for ten minutes first, so the demo shows a target
// overrunning its target-scan deadline.
import { readdirSync, readFileSync, statSync } from "node:fs"
import { join, relative } from "node:path"
import { lintSource } from "@secretlint/core"
import { creator } from "@secretlint/secretlint-rule-preset-recommend"

const root = process.argv[2]
const flag = (name) => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? process.argv[i + 1] : undefined
}
const marker = flag("slow-marker")
if (marker && (flag("identity") ?? "").includes(marker)) await new Promise((r) => setTimeout(r, 600_000))
if (!root || !statSync(root, { throwIfNoEntry: false })?.isDirectory()) {
  process.stderr.write("usage: secretlint-scan.mjs DIRECTORY\n")
  process.exit(2)
}
const files = (dir) => readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.name === ".git" ? [] : e.isDirectory() ? files(join(dir, e.name)) : e.isFile() ? [join(dir, e.name)] : []))
const config = { rules: [{ id: "@secretlint/secretlint-rule-preset-recommend", rule: creator }] }
let found = 0
for (const file of files(root).sort()) {
  const content = readFileSync(file, "utf8")
  const r = await lintSource({ source: { filePath: file, content, contentType: "text" }, options: { config } })
  for (const m of r.messages) {
    found++
    process.stdout.write(`${JSON.stringify({ ...m, filePath: relative(root, file) })}\n`)
  }
}
process.stderr.write(`secretlint: ${found} finding(s) in ${root}\n`)
process.exit(found > 0 ? 3 : 0)
