import { levelSuites } from "./support/Contained.js"

/** The adversarial scanners under pid-namespace (see support/Contained.ts; one file per level, so levels run in parallel). */
levelSuites("pid-namespace")
