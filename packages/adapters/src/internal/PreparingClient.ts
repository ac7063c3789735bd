import { createHash } from "node:crypto"
import * as Pg from "pg"
import { marker } from "./Prepared.js"

// Per connection; past it a marked statement runs unnamed, so a connection never
// accumulates statements without bound whatever the callers send.
const perConnection = 64

// A statement is prepared again (a new plan) when its runs on the connection reach this, then
// each time they double. PostgreSQL keeps a prepared statement's generic plan until the tables'
// statistics change, and the hot statements grow their own tables (reservations, progress): a
// plan made when a fresh table had a few pages (a sequential scan, right then) would otherwise
// stay until autovacuum's next analyse, a minute or more later, and cost more with every run.
const firstReplan = 16

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

// A statement's server-side name is its text's name and the generation of its plan.
interface Prepared {
  generation: number
  runs: number
  replanAt: number
}

/**
 * A `pg` client that runs marked statements as named prepared statements (one per statement
 * text), prepared again each time its runs double from 16, so the plan follows the tables' growth.
 */
export class PreparingClient extends Pg.Client {
  readonly #prepared = new Map<string, Prepared>()

  // The pool and @effect/sql-pg call query(text, values, callback); anything else passes through.
  override query(...args: Array<any>): any {
    const [text, values, callback] = args
    if (typeof text === "string" && text.startsWith(marker) && (values === undefined || Array.isArray(values)) && typeof callback === "function") {
      const base = nameOf(text)
      let p = this.#prepared.get(base)
      if (p === undefined && this.#prepared.size < perConnection) {
        p = { generation: 0, runs: 0, replanAt: firstReplan }
        this.#prepared.set(base, p)
      }
      if (p !== undefined) {
        if (++p.runs > p.replanAt) {
          // The old plan goes first (queued on this connection like any query; a failure, as in an
          // aborted transaction, leaves one unused statement behind and changes nothing else).
          super.query(`DEALLOCATE "${base}_${p.generation}"`, () => {})
          p.generation++
          p.replanAt *= 2
        }
        return super.query({ name: `${base}_${p.generation}`, text, values }, callback)
      }
    }
    return (super.query as (...a: Array<any>) => any)(...args)
  }
}
