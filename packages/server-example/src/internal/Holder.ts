import { randomBytes } from "node:crypto"
import { hostname } from "node:os"

/**
 * A name for this process as the holder of a lease (`host:pid:random`): what an operator
 * reads in the leases of several server instances, and different for every holder even
 * when two share a host and a pid namespace.
 */
export const make = (): string => `${hostname()}:${process.pid}:${randomBytes(4).toString("hex")}`
