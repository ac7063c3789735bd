/**
 * The comment that opens a statement the Postgres store runs as a named
 * prepared statement. `@effect/sql-pg` sends every statement unnamed, so
 * PostgreSQL parses, analyses and plans it on every call; for the large
 * data-modifying CTEs of the hot paths (claim, result, progress) that costs about
 * as much as running them. Only statements whose text takes a bounded number of
 * shapes carry the marker.
 */
export const marker = "/* scanfleet:prepared */ "
