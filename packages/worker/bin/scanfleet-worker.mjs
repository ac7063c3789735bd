#!/usr/bin/env node
// The scanfleet-worker command; the code lives in the built package.
import { Cli } from "../dist/index.js"

process.exitCode = await Cli.main(process.argv.slice(2))
