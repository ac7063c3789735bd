import { levelSuites } from "./support/Contained.js"

/** The adversarial scanners under cgroup-v2 (see support/Contained.ts; one file per level, so levels run in parallel). */
levelSuites("cgroup-v2")
