import Sqlite from "better-sqlite3"
import type { Errors } from "@scanfleet/core"
import { randomBytes } from "node:crypto"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest"
import { isReadOnly, pgClasses, pgCodes, reasonOf, sqliteCodes } from "../src/internal/SqlErrors.js"

/**
 * The mapping from a driver's error to a StoreError reason, code by code, with
 * each code provoked for real where a client or the machine can provoke it: the
 * test first checks the database answered with exactly that code, so a
 * provocation that stops provoking fails here rather than testing nothing.
 */

type Reason = Errors.StoreError["reason"]

const caught = async (f: () => unknown): Promise<any> => {
  try {
    await f()
  } catch (e) {
    return e
  }
  throw new Error("the statement was expected to fail")
}

describe("PostgreSQL SQLSTATEs map to reasons, each provoked on a real server", () => {
  let a: pg.Client
  let b: pg.Client
  const schema = `sf_err_${Date.now().toString(36)}`
  beforeAll(async () => {
    a = new pg.Client({ connectionString: inject("pgUrl") })
    b = new pg.Client({ connectionString: inject("pgUrl") })
    await a.connect()
    await b.connect()
    await a.query(`CREATE SCHEMA ${schema}`)
    await a.query(`SET search_path = ${schema}`)
    await b.query(`SET search_path = ${schema}`)
    await a.query(`CREATE TABLE t (id int PRIMARY KEY, v varchar(4), n int NOT NULL DEFAULT 0 CHECK (n >= 0), p int REFERENCES t (id), txt text)`)
    await a.query(`CREATE INDEX t_txt ON t (txt)`)
    await a.query(`INSERT INTO t (id) VALUES (1), (2)`)
  })
  afterAll(async () => {
    await a?.query(`DROP SCHEMA ${schema} CASCADE`).catch(() => undefined)
    await a?.end()
    await b?.end().catch(() => undefined)
  })

  const cases: ReadonlyArray<[string, Reason, () => Promise<unknown>]> = [
    ["22021", "invalid", () => a.query("INSERT INTO t (id, txt) VALUES (10, $1)", ["a\u0000b"])],
    ["22001", "invalid", () => a.query("INSERT INTO t (id, v) VALUES (11, 'too long')")],
    ["22P02", "invalid", () => a.query("SELECT $1::int", ["x"])],
    ["22003", "invalid", () => a.query("SELECT $1::int", ["99999999999"])],
    ["22012", "invalid", () => a.query("SELECT 1 / (SELECT count(*) FROM t WHERE id < 0)::int")],
    ["22P05", "invalid", () => a.query("SELECT $1::jsonb", ['"\\u0000"'])],
    ["54000", "invalid", () => a.query("INSERT INTO t (id, txt) VALUES (12, $1)", [randomBytes(8000).toString("base64")])],
    // more parameters than the protocol's 65,535: the bind message is refused, the connection stays
    ["08P01", "invalid", () => a.query(`SELECT 1 WHERE 1 IN (${Array.from({ length: 65_536 }, (_, i) => `$${i + 1}`).join(",")})`, Array.from({ length: 65_536 }, (_, i) => i))],
    ["23505", "constraint", () => a.query("INSERT INTO t (id) VALUES (1)")],
    ["23502", "constraint", () => a.query("INSERT INTO t (id, n) VALUES (13, NULL)")],
    ["23514", "constraint", () => a.query("INSERT INTO t (id, n) VALUES (14, -1)")],
    ["23503", "constraint", () => a.query("INSERT INTO t (id, p) VALUES (15, 999)")],
    ["42P01", "internal", () => a.query("SELECT * FROM no_such_table")],
    ["42601", "internal", () => a.query("SELEC 1")],
    ["57014", "unavailable", async () => {
      await a.query("SET statement_timeout = 50")
      try {
        await a.query("SELECT pg_sleep(2)")
      } finally {
        await a.query("SET statement_timeout = 0")
      }
    }],
    ["55P03", "conflict", async () => {
      await b.query("BEGIN")
      await b.query("SELECT * FROM t WHERE id = 1 FOR UPDATE")
      try {
        await a.query("SELECT * FROM t WHERE id = 1 FOR UPDATE NOWAIT")
      } finally {
        await b.query("ROLLBACK")
      }
    }],
    ["40001", "conflict", async () => {
      await a.query("BEGIN ISOLATION LEVEL SERIALIZABLE")
      await b.query("BEGIN ISOLATION LEVEL SERIALIZABLE")
      try {
        await a.query("SELECT n FROM t WHERE id = 2")
        await b.query("SELECT n FROM t WHERE id = 2")
        await b.query("UPDATE t SET n = n + 1 WHERE id = 2")
        await b.query("COMMIT")
        await a.query("UPDATE t SET n = n + 1 WHERE id = 2")
      } finally {
        await a.query("ROLLBACK")
        await b.query("ROLLBACK").catch(() => undefined)
      }
    }],
    ["40P01", "conflict", async () => {
      await a.query("BEGIN")
      await b.query("BEGIN")
      try {
        await a.query("UPDATE t SET n = n WHERE id = 1")
        await b.query("UPDATE t SET n = n WHERE id = 2")
        const first = b.query("UPDATE t SET n = n WHERE id = 1").catch((e) => e)
        const second = await a.query("UPDATE t SET n = n WHERE id = 2").catch((e) => e)
        const other = await first
        // One of the two is chosen as the victim.
        throw second instanceof Error ? second : other
      } finally {
        await a.query("ROLLBACK")
        await b.query("ROLLBACK")
      }
    }],
    ["25P02", "internal", async () => {
      await a.query("BEGIN")
      try {
        await a.query("SELEC 1").catch(() => undefined)
        await a.query("SELECT 1")
      } finally {
        await a.query("ROLLBACK")
      }
    }],
    // a standby, or `default_transaction_read_only`: every write of the transaction is refused
    ["25006", "unavailable", async () => {
      await a.query("BEGIN READ ONLY")
      try {
        await a.query("INSERT INTO t (id) VALUES (16)")
      } finally {
        await a.query("ROLLBACK")
      }
    }],
    ["3D000", "unavailable", async () => {
      const u = new URL(inject("pgUrl"))
      u.pathname = "/no_such_database_here"
      const c = new pg.Client({ connectionString: u.toString() })
      try {
        await c.connect()
      } finally {
        await c.end().catch(() => undefined)
      }
    }],
    ["57P01", "unavailable", async () => {
      const c = new pg.Client({ connectionString: inject("pgUrl") })
      // The terminated connection also reports on the client itself; listen before anything can happen.
      c.on("error", () => undefined)
      await c.connect()
      const pid = (await c.query("SELECT pg_backend_pid() AS pid")).rows[0].pid
      const sleeping = c.query("SELECT pg_sleep(5)")
      sleeping.catch(() => undefined)
      // Terminate it while the statement runs (not before it arrived), however loaded the machine is.
      for (let i = 0; i < 200; i++) {
        const r = await a.query("SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active' AND query LIKE 'SELECT pg_sleep%'", [pid])
        if (r.rowCount) break
        await new Promise((r) => setTimeout(r, 10))
      }
      await a.query("SELECT pg_terminate_backend($1)", [pid])
      try {
        await sleeping
      } finally {
        await c.end().catch(() => undefined)
      }
    }]
  ]

  it.each(cases.map(([code, reason]) => [code, reason] as const))("SQLSTATE %s is reason %s", async (code, reason) => {
    const provoke = cases.find((c) => c[0] === code)![2]
    const e = await caught(provoke)
    expect(e.code, String(e)).toBe(code)
    expect(reasonOf(e)).toBe(reason)
  })

  it("a write refused by a read-only database (25006) is told apart from an unreachable one; no other provoked code is", async () => {
    for (const [code, , provoke] of cases) {
      const e = await caught(provoke)
      expect(isReadOnly(e), code).toBe(code === "25006")
    }
  })

  it("a refused connection (no server on the port) is reason unavailable", async () => {
    const c = new pg.Client({ connectionString: "postgres://x:y@127.0.0.1:1/none", connectionTimeoutMillis: 2000 })
    const e = await caught(() => c.connect())
    expect(e.code).toBe("ECONNREFUSED")
    expect(reasonOf(e)).toBe("unavailable")
  })

  it("the table of codes that cannot be provoked here: disk full and out of memory are full; shutdowns and I/O errors unavailable; corruption corrupt", () => {
    expect(reasonOf({ code: "53100" })).toBe("full")
    expect(reasonOf({ code: "53200" })).toBe("full")
    expect(reasonOf({ code: "53300" })).toBe("unavailable")
    expect(reasonOf({ code: "57P03" })).toBe("unavailable")
    expect(reasonOf({ code: "58030" })).toBe("unavailable")
    expect(reasonOf({ code: "08006" })).toBe("unavailable")
    expect(reasonOf({ code: "40003" })).toBe("unavailable")
    expect(reasonOf({ code: "XX001" })).toBe("corrupt")
    expect(reasonOf({ code: "XX000" })).toBe("internal")
    expect(reasonOf({ code: "22008" })).toBe("invalid")
    expect(reasonOf({ code: "23P01" })).toBe("constraint")
    // Every listed code and class has a reason that core knows.
    for (const r of [...Object.values(pgCodes), ...Object.values(pgClasses)]) expect(["unavailable", "full", "conflict", "invalid", "constraint", "corrupt", "internal"]).toContain(r)
  })
})

describe("SQLite result codes map to reasons, each provoked on a real file", () => {
  let dir: string
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "scanfleet-sqlerr-"))
  })
  afterAll(() => rmSync(dir, { recursive: true, force: true }))

  const open = (name: string, opts?: Sqlite.Options) => {
    const db = new Sqlite(join(dir, name), opts)
    db.pragma("journal_mode = WAL")
    db.exec("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT NOT NULL DEFAULT '', n INTEGER NOT NULL DEFAULT 0 CHECK (n >= 0), u TEXT UNIQUE)")
    return db
  }

  const cases: ReadonlyArray<[string, Reason, () => unknown]> = [
    ["SQLITE_CONSTRAINT_PRIMARYKEY", "constraint", () => {
      const db = open("c.db")
      db.exec("INSERT OR IGNORE INTO t (id) VALUES (1)")
      db.exec("INSERT INTO t (id) VALUES (1)")
    }],
    ["SQLITE_CONSTRAINT_NOTNULL", "constraint", () => open("c.db").prepare("INSERT INTO t (id, v) VALUES (2, ?)").run(null)],
    ["SQLITE_CONSTRAINT_CHECK", "constraint", () => open("c.db").exec("INSERT INTO t (id, n) VALUES (3, -1)")],
    ["SQLITE_CONSTRAINT_UNIQUE", "constraint", () => {
      const db = open("c.db")
      db.exec("INSERT OR IGNORE INTO t (id, u) VALUES (4, 'x')")
      db.exec("INSERT INTO t (id, u) VALUES (5, 'x')")
    }],
    ["SQLITE_MISMATCH", "invalid", () => open("c.db").prepare("INSERT INTO t (id) VALUES (?)").run("not a rowid")],
    ["SQLITE_TOOBIG", "invalid", () => {
      // Past SQLITE_MAX_LENGTH (1e9 bytes by default).
      open("big.db").prepare("SELECT zeroblob(?)").get(2_000_000_001)
    }],
    ["SQLITE_FULL", "full", () => {
      // The file may not grow past its current pages: what a full disk answers (the tmpfs test of the server shows the disk itself).
      const db = open("full.db")
      db.pragma(`max_page_count = ${Number(db.pragma("page_count", { simple: true }))}`)
      db.prepare("INSERT INTO t (v) VALUES (?)").run("x".repeat(100_000))
    }],
    ["SQLITE_BUSY", "conflict", () => {
      const holder = open("busy.db")
      const other = open("busy.db", { timeout: 0 })
      holder.exec("BEGIN IMMEDIATE")
      try {
        other.exec("BEGIN IMMEDIATE")
      } finally {
        holder.exec("ROLLBACK")
      }
    }],
    ["SQLITE_ERROR", "internal", () => open("c.db").exec("SELECT * FROM no_such_table")],
    ["SQLITE_READONLY", "unavailable", () => {
      open("ro.db").close()
      new Sqlite(join(dir, "ro.db"), { readonly: true }).exec("INSERT INTO t (id) VALUES (9)")
    }],
    ["SQLITE_CANTOPEN", "unavailable", () => new Sqlite(dir) /* a directory, not a file */],
    ["SQLITE_NOTADB", "corrupt", () => {
      writeFileSync(join(dir, "junk.db"), Buffer.alloc(8192, 7))
      new Sqlite(join(dir, "junk.db")).exec("SELECT * FROM sqlite_master")
    }]
  ]

  it.each(cases.map(([code, reason]) => [code, reason] as const))("%s is reason %s", async (code, reason) => {
    const e = await caught(cases.find((c) => c[0] === code)![2])
    expect(e.code, String(e)).toBe(code)
    expect(reasonOf(e)).toBe(reason)
  })

  it("a write to a read-only file (SQLITE_READONLY) is told apart from a file that cannot be opened; no other provoked code is", async () => {
    for (const [code, , provoke] of cases) {
      const e = await caught(provoke)
      expect(isReadOnly(e), code).toBe(code === "SQLITE_READONLY")
    }
  })

  it("the table of codes not provoked here: out of memory and no large files are full; I/O errors unavailable; corruption corrupt", () => {
    expect(reasonOf({ code: "SQLITE_NOMEM" })).toBe("full")
    expect(reasonOf({ code: "SQLITE_IOERR_WRITE" })).toBe("unavailable")
    expect(reasonOf({ code: "SQLITE_IOERR_FSYNC" })).toBe("unavailable")
    expect(reasonOf({ code: "SQLITE_BUSY_SNAPSHOT" })).toBe("conflict")
    expect(reasonOf({ code: "SQLITE_LOCKED_SHAREDCACHE" })).toBe("conflict")
    expect(reasonOf({ code: "SQLITE_CORRUPT_VTAB" })).toBe("corrupt")
    expect(reasonOf(new TypeError("Too many parameter values were provided"))).toBe("internal")
    for (const r of Object.values(sqliteCodes)) expect(["unavailable", "full", "conflict", "invalid", "constraint", "corrupt", "internal"]).toContain(r)
  })
})
