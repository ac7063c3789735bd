import { levelSuites } from "./support/Contained.js"

/** The adversarial scanners under cgroup-v1-freezer (see support/Contained.ts; one file per level, so levels run in parallel). */
levelSuites("cgroup-v1-freezer")
