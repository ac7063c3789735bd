#!/usr/bin/env node
import { main } from "./Cli.js"

main(process.argv.slice(2)).then((code) => {
  process.exitCode = code
})
