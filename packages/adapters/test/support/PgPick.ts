import { Effect } from "effect"
import pg from "pg"

/**
 * The plan of a PostgreSQL claim's pick: scanfleet_claimable's query (migration 0013) as the
 * catalog holds it, under the settings the function runs with, its arguments as parameters
 * ($1 the sources, $2 the count). EXPLAIN cannot see into a function; this is its query, exactly.
 * Run in a transaction that is rolled back.
 */
export const pickPlan = (url: string, how: string, values?: ReadonlyArray<unknown>) =>
  Effect.promise(async () => {
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    try {
      const { rows } = await client.query("SELECT prosrc, proconfig FROM pg_proc WHERE proname = 'scanfleet_claimable'")
      const body = String(rows[0].prosrc).replace(/\bsources\b/g, "$1::text[]").replace(/\bn\b/g, "$2::bigint")
      await client.query("BEGIN")
      for (const setting of rows[0].proconfig as Array<string>) {
        const [name, value] = setting.split("=")
        await client.query(`SET LOCAL ${name} = ${value}`)
      }
      const plan = await client.query(`EXPLAIN (${how}) ${body}`, values as Array<unknown> | undefined)
      await client.query("ROLLBACK")
      return plan.rows.map((r: Record<string, string>) => r["QUERY PLAN"]).join("\n")
    } finally {
      await client.end()
    }
  })
