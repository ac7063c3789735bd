import { createHash } from "node:crypto"
import * as Pg from "pg"
import { marker } from "./Prepared.js"

// Per connection; past it a marked statement runs unnamed, so a connection never
// accumulates statements without bound whatever the callers send.
const perConnection = 64

const names = new Map<string, string>()
const nameOf = (text: string): string => {
  let name = names.get(text)
  if (name === undefined) {
    name = `sf_${createHash("sha256").update(text).digest("base64url").slice(0, 32)}`
    if (names.size >= 1024) names.clear()
    names.set(text, name)
  }
  return name
}

/** A `pg` client that runs marked statements as named prepared statements (one per statement text). */
export class PreparingClient extends Pg.Client {
  readonly #prepared = new Set<string>()

  // The pool and @effect/sql-pg call query(text, values, callback); anything else passes through.
  override query(...args: Array<any>): any {
    const [text, values, callback] = args
    if (typeof text === "string" && text.startsWith(marker) && (values === undefined || Array.isArray(values)) && typeof callback === "function") {
      const name = nameOf(text)
      if (this.#prepared.has(name) || this.#prepared.size < perConnection) {
        this.#prepared.add(name)
        return super.query({ name, text, values }, callback)
      }
    }
    return (super.query as (...a: Array<any>) => any)(...args)
  }
}
