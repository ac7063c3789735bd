import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

/**
 * Rows found damaged (a payload that is not the JSON it should be, or not its
 * shape) are moved here, out of the tables the device works from, so one bad
 * row costs that row alone. `row` keeps the row as it was, for a person to
 * inspect; it is never logged (a row may hold a secret). `at` is the wall clock.
 */
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE damaged_rows (
      n INTEGER PRIMARY KEY,
      at INTEGER NOT NULL,
      table_name TEXT NOT NULL,
      row_key TEXT NOT NULL,
      problem TEXT NOT NULL,
      lost TEXT NOT NULL,
      row TEXT NOT NULL)`
})
