import { levelSuites } from "./support/Contained.js"

/** The adversarial scanners under freeze-kill (see support/Contained.ts; one file per level, so levels run in parallel). */
levelSuites("freeze-kill")
