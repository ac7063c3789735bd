import { Effect } from "effect"

/**
 * Nothing to do on SQLite. PostgreSQL's 0014 drops the reference checks of reservations and
 * progress events, whose cost there is a trigger call and a row lock written per row. SQLite keeps
 * its references: a check is a lookup of the parent's rowid inside the write transaction that
 * already holds the database, with nothing written, and dropping a constraint would mean
 * rebuilding the table.
 */
export default Effect.void
