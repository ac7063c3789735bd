// The server-example as its own process, configured by SCANFLEET_* variables (as `scanfleet-server serve`).
import { Cli } from "@scanfleet/server-example"

Cli.main(["serve"]).then((code) => process.exit(code))
