// Entry of `npm start`. tsx is registered here, in this process only, rather
// than with `node --import tsx`: flags on the command line are inherited by
// every process the workers fork, and each execution unit would pay for
// loading the TypeScript compiler before it could start its scanner.
import { register } from "tsx/esm/api"

register()
await import("./main.ts")
