import * as Reactivity from "@effect/experimental/Reactivity"
import { SqlClient, SqlConnection, SqlError, Statement } from "@effect/sql"
import Sqlite from "better-sqlite3"
import { Cause, Duration, Effect, Either, Exit, Fiber, FiberRef, Option, Schedule, Scope } from "effect"
import { type Stats, statSync } from "node:fs"
import { createRequire } from "node:module"
import { Worker } from "node:worker_threads"

/** How a SQLite database file is opened. */
export interface Options {
  readonly filename: string
  readonly readonly?: boolean | undefined
  readonly disableWAL?: boolean | undefined
  /**
   * How long a statement or transaction keeps retrying while another connection
   * holds the write lock (default 5 seconds, as SQLite's usual busy timeout), in all
   * for one operation, also when the store runs it again after a refusal. The waits
   * are asynchronous: the event loop keeps serving meanwhile.
   */
  readonly busyTimeout?: Duration.DurationInput | undefined
  /**
   * When a commit reaches the disk. `"normal"` (the default, in WAL mode): at
   * checkpoints, so a commit costs no fsync on the event loop; a commit survives a
   * crash of the process, and only an operating-system crash or power loss may
   * undo the last ones (never corrupting the file). `"full"`: an fsync per commit.
   */
  readonly synchronous?: "normal" | "full" | undefined
}

/** One open database: the connection, and a way to run synchronous work on it in turn. */
export interface Database {
  readonly db: Sqlite.Database
  /**
   * Runs `f` (synchronous, typically one `db.transaction`) when no other work of this
   * process holds the connection, retrying asynchronously while another process holds
   * the write lock, up to the busy timeout or the instant `until` (epoch ms), whichever
   * comes first; a driver error fails as SqlError.
   */
  readonly run: <A>(f: (db: Sqlite.Database) => A, options?: { readonly until?: number }) => Effect.Effect<A, SqlError.SqlError>
  /**
   * Runs `f` at once when nothing can interleave with it (no transaction of the client is
   * open on the connection) and no other process holds the write lock; `undefined` when it
   * must wait its turn instead, through `run`.
   */
  readonly runNow: <A>(f: (db: Sqlite.Database) => A) => Either.Either<A, SqlError.SqlError> | undefined
}

const codeOf = (e: unknown): string => (typeof e === "object" && e !== null && typeof (e as { code?: unknown }).code === "string" ? (e as { code: string }).code : "")

/** The lock was held by another connection: SQLite did nothing, so the same work may run again. */
export const isBusy = (e: unknown): boolean => {
  const cause = e instanceof SqlError.SqlError ? e.cause : e
  return codeOf(cause).startsWith("SQLITE_BUSY")
}

// Short first waits (a competing transaction is usually a few hundred microseconds
// long), never more than 20 ms between tries, jittered so competitors spread out.
const busySchedule = (timeout: Duration.DurationInput) =>
  Schedule.exponential("500 micros", 2).pipe(
    Schedule.modifyDelay((d) => Duration.min(d, Duration.millis(20))),
    Schedule.jittered,
    Schedule.upTo(timeout)
  )

/**
 * Opens the file and makes both faces of it: an `@effect/sql` client (for the
 * statements that go through tagged templates, and for other ports that share
 * the file) and the `Database` for prepared statements run synchronously. Both
 * take turns on one connection under one permit, so a synchronous transaction
 * never interleaves with an `@effect/sql` one. SQLite's own busy handler is off
 * (`busy_timeout = 0`): it sleeps on the event loop; waits are retried here instead.
 */
export const make = (options: Options): Effect.Effect<{ readonly client: SqlClient.SqlClient; readonly database: Database }, SqlError.SqlError, Scope.Scope | Reactivity.Reactivity> =>
  Effect.gen(function* () {
    const db = yield* Effect.acquireRelease(
      Effect.try({
        try: () => new Sqlite(options.filename, { readonly: options.readonly ?? false, timeout: 0 }),
        catch: (cause) => new SqlError.SqlError({ cause, message: `Failed to open ${options.filename}` })
      }),
      (db) => Effect.sync(() => db.close())
    )
    const gone = yield* watchFile(db, options.filename)
    const busyMs = Duration.toMillis(options.busyTimeout ?? Duration.seconds(5))
    // While another process holds the write lock, one waiter at a time tries again; the others
    // queue behind it (first come, first served) and try in turn once it got through. So a lock
    // held elsewhere costs a try per interval, not a try per waiting operation, each try failing
    // with an error object: with hundreds of requests waiting, that storm was most of the
    // process's CPU. A try inside a transaction of this connection cannot meet a lock held
    // elsewhere (the transaction holds it); should it, it retries alone rather than wait in a
    // queue whose head needs this connection.
    const waiters = yield* Effect.makeSemaphore(1)
    // The turn, waited for `ms` at most: true when this fiber holds it. The wait ends at its deadline
    // in an uninterruptible region too (@effect/sql acquires a transaction's connection in one), where
    // a timeout cannot stop a wait but only wait for its end: a transaction waited past its deadline,
    // got the turn and dropped it as timed out, and with the only turn lost, every later transaction
    // that met the lock taken (the expiry sweep's, a result's) waited for ever. A turn granted just as
    // the wait times out is handed back.
    const turn = (ms: number): Effect.Effect<boolean> =>
      Effect.raceWith(Effect.interruptible(waiters.take(1)), Effect.interruptible(Effect.sleep(ms)), {
        onSelfDone: (took, timer) => Effect.as(Fiber.interrupt(timer), Exit.isSuccess(took)),
        onOtherDone: (_, taker) => Effect.flatMap(Fiber.interrupt(taker), (took) => (Exit.isSuccess(took) ? Effect.as(waiters.release(1), false) : Effect.succeed(false)))
      })
    // When this fiber's last wait for the lock was refused (0: its last wait got through). One budget per
    // operation, across the store's own runs of it again too: a transaction refused on the busy lock is
    // run again up to four times (a `conflict`), and each run waited a budget of its own, so a result
    // waited 25 s for its 503 instead of 5. A fiber refused less than a budget ago has no wait left.
    const refusedAt = FiberRef.unsafeMake(0)
    // The schedule is built only once a first try found the lock taken: the common path pays nothing for it.
    const retryBusyUntil = <A, R>(self: Effect.Effect<A, SqlError.SqlError, R>, until?: number) =>
      Effect.catchIf(self, isBusy, (first) =>
        Effect.flatMap(FiberRef.get(refusedAt), (refused) => {
          const now = Date.now()
          const deadline = Math.min(until ?? Number.POSITIVE_INFINITY, now - refused < busyMs ? refused : now + busyMs)
          if (deadline <= now) return Effect.fail(first)
          const again = Effect.suspend(() =>
            Effect.retry(self, { while: (e) => isBusy(e) && Date.now() <= deadline, schedule: busySchedule(Math.max(0, deadline - Date.now())) })
          )
          // The turn is waited for uninterruptibly (the wait is bounded by the deadline), so no turn is taken and lost.
          const waited = db.inTransaction
            ? again
            : Effect.uninterruptibleMask((restore) =>
                Effect.flatMap(turn(deadline - now), (mine) => (mine ? Effect.ensuring(restore(again), waiters.release(1)) : Effect.fail(first)))
              )
          return Effect.onExit(waited, (exit) => FiberRef.set(refusedAt, Exit.isFailure(exit) && Option.exists(Cause.failureOption(exit.cause), isBusy) ? deadline : 0))
        })
      )
    const retryBusy = <A, R>(self: Effect.Effect<A, SqlError.SqlError, R>) => retryBusyUntil(self)
    const attempt = <A>(message: string, f: () => A) =>
      Effect.try({ try: f, catch: (cause) => new SqlError.SqlError({ cause, message }) })
    // Called first by every statement and transaction: none runs once the path no longer names the open file.
    const live = () => {
      if (gone.error !== undefined) throw gone.error
    }
    yield* retryBusy(
      attempt("Failed to configure the database", () => {
        if (options.disableWAL !== true && options.readonly !== true) {
          db.pragma("journal_mode = WAL")
          // When this connection, writing, starts the log over (after a complete checkpoint), it cuts the file back to this size.
          db.pragma(`journal_size_limit = ${walLimitFrames * Number(db.pragma("page_size", { simple: true }))}`)
        }
        db.pragma(`synchronous = ${options.synchronous === "full" ? "FULL" : "NORMAL"}`)
      })
    )

    const restarts = options.disableWAL !== true && options.readonly !== true ? yield* checkpointer(db, options.filename) : noRestarts

    // The text @effect/sql sends to begin a transaction that the acquirer has already begun.
    const begun = "-- begun by the transaction acquirer"
    // Prepared once per statement text: @effect/sql compiles a template to the same text each time.
    const prepared = new Map<string, Sqlite.Statement>()
    const prepare = (text: string) => {
      let s = prepared.get(text)
      if (s === undefined) {
        s = db.prepare(text)
        if (prepared.size >= 500) prepared.delete(prepared.keys().next().value!)
        prepared.set(text, s)
      }
      return s
    }
    const rows = (s: Sqlite.Statement, params: ReadonlyArray<unknown>): ReadonlyArray<any> => {
      if (s.reader) return s.all(...params)
      s.run(...params)
      return []
    }
    // A failed COMMIT leaves SQLite's transaction open (or half-closed): roll it back, so
    // the connection is usable for the next transaction whatever the failure was.
    const finish = (text: string) => {
      // Nothing to roll back when a failed COMMIT already did.
      if (text === "ROLLBACK" && !db.inTransaction) return
      try {
        db.exec(text)
      } catch (e) {
        if (!isBusy(e) && db.inTransaction) db.exec("ROLLBACK")
        throw e
      }
    }
    const exec = (text: string, params: ReadonlyArray<unknown>, unprepared: boolean) =>
      retryBusy(
        attempt("Failed to execute statement", () => {
          if (params.length === 0 && text === begun) return []
          if (params.length === 0 && (text === "COMMIT" || text === "ROLLBACK")) {
            // A transaction whose file went meanwhile is rolled back, never committed into it.
            if (text === "COMMIT" && gone.error !== undefined) {
              finish("ROLLBACK")
              throw gone.error
            }
            finish(text)
            return []
          }
          live()
          return rows(unprepared ? db.prepare(text) : prepare(text), params)
        })
      )
    const connection: SqlConnection.Connection = {
      execute: (text, params, transformRows) => (transformRows ? Effect.map(exec(text, params, false), transformRows) : exec(text, params, false)),
      executeRaw: (text, params) => exec(text, params, false),
      executeValues: (text, params) =>
        retryBusy(
          attempt("Failed to execute statement", () => {
            live()
            const s = prepare(text)
            if (!s.reader) return (s.run(...params), [])
            try {
              return s.raw(true).all(...params) as ReadonlyArray<ReadonlyArray<unknown>>
            } finally {
              s.raw(false)
            }
          })
        ),
      executeUnprepared: (text, params, transformRows) => {
        const e = exec(text, params ?? [], true)
        return transformRows ? Effect.map(e, transformRows) : e
      },
      executeStream: () => Effect.dieMessage("executeStream is not implemented for SQLite")
    }

    const permit = yield* Effect.makeSemaphore(1)
    const acquirer = permit.withPermits(1)(Effect.succeed(connection))
    // A transaction takes the permit and the write lock together (BEGIN IMMEDIATE, here rather
    // than in @effect/sql's begin, which is then a no-op): while another process holds the lock
    // the permit is given back between tries, so this process's reads and other work go on.
    // Once BEGIN succeeded, the permit's release is on the transaction's scope in the same step.
    const beginOnce = Effect.flatMap(Effect.scope, (scope) =>
      Effect.uninterruptibleMask((restore) =>
        Effect.flatMap(restore(permit.take(1)), () =>
          Effect.matchEffect(
            attempt("Failed to begin a transaction", () => {
              live()
              db.exec("BEGIN IMMEDIATE")
            }),
            { onFailure: (e) => Effect.zipRight(permit.release(1), Effect.fail(e)), onSuccess: () => Scope.addFinalizer(scope, permit.release(1)) }
          )
        )
      )
    )
    // Uninterruptible as a whole (as @effect/sql runs it anyway; every wait in it is bounded): an
    // interruption between BEGIN and the end of the acquisition would leave the transaction open and
    // its permit taken, since a failed acquisition's scope is never closed.
    const transactionAcquirer = Effect.as(Effect.uninterruptible(retryBusy(beginOnce)), connection)
    const client = yield* SqlClient.make({
      acquirer,
      transactionAcquirer,
      compiler: Statement.makeCompilerSqlite(),
      // Begun by the transaction acquirer with BEGIN IMMEDIATE: a transaction never reads and then fails to upgrade.
      beginTransaction: begun,
      spanAttributes: [["db.system.name", "sqlite"]]
    })
    // With no transaction of the client open on the connection, nothing can interleave with
    // synchronous work: it runs at once, without taking the permit (what taking it would wait
    // for is a transaction begun and not yet ended). Only a busy lock goes the queued way.
    const runNow = <A>(f: (db: Sqlite.Database) => A): Either.Either<A, SqlError.SqlError> | undefined => {
      if (db.inTransaction || restarts.pending()) return undefined
      try {
        live()
        return Either.right(f(db))
      } catch (cause) {
        return isBusy(cause) ? undefined : Either.left(new SqlError.SqlError({ cause, message: "Failed to run a transaction" }))
      }
    }
    const database: Database = {
      db,
      runNow,
      run: (f, o) => {
        const queued = retryBusyUntil(
          permit.withPermits(1)(
            attempt("Failed to run a transaction", () => {
              live()
              return f(db)
            })
          ),
          o?.until
        )
        // While the checkpoint thread restarts the log, wait for it rather than contend for the lock.
        return Effect.suspend(() => runNow(f) ?? (restarts.pending() ? Effect.zipRight(restarts.ended, queued) : queued))
      }
    }
    return { client, database }
  })

/** Whether the path still names the open file: `error` is set, for good, once it does not. */
interface Watched {
  error: (Error & { readonly code: string }) | undefined
}

/**
 * Once a second, whether the path still names the file the connection has open (same device
 * and inode). A database file deleted or replaced while open (its -wal and -shm with it) went
 * unnoticed: the connection wrote on into the unlinked file, `/readyz` stayed 200, results were
 * accepted and lost, and a restart created an empty fleet. From then on every statement and
 * transaction fails as `SQLITE_CANTOPEN` (`unavailable`, HTTP 503) and an error is logged; only a
 * restart opens the file the path names now. The check is a `stat` a second, off the statements'
 * path, which only read the flag.
 */
const watchFile = (db: Sqlite.Database, filename: string): Effect.Effect<Watched, never, Scope.Scope> =>
  Effect.gen(function* () {
    const watched: Watched = { error: undefined }
    if (db.memory || filename === "" || filename.startsWith("file:")) return watched
    const identity = (s: Stats | undefined) => (s === undefined ? undefined : `${s.dev}:${s.ino}`)
    const opened = yield* Effect.orElseSucceed(Effect.try(() => identity(statSync(filename, { throwIfNoEntry: false }))), () => undefined)
    if (opened === undefined) return watched
    // A failed stat (a permission taken away) is no verdict: tried again the next second.
    const check = Effect.flatMap(Effect.option(Effect.try(() => identity(statSync(filename, { throwIfNoEntry: false })))), (now) => {
      if (Option.isNone(now) || now.value === opened) return Effect.void
      const message = `the database file ${filename} was ${now.value === undefined ? "deleted" : "replaced"} while open: every statement is refused; restart to open the file the path names now`
      watched.error = Object.assign(new Error(message), { code: "SQLITE_CANTOPEN" })
      return Effect.logError(message)
    })
    yield* Effect.forkScoped(Effect.repeat(check, { schedule: Schedule.spaced("1 second"), until: () => watched.error !== undefined }))
    return watched
  })

// Runs in a worker thread: PASSIVE checkpoints on a connection of its own, which never
// block the writer and keep their page copies and fsyncs off the event loop. A writer
// that commits all the time outruns them: the log is only started over when a checkpoint
// has copied every frame before the next commit, so it would grow without end (1.2 GB
// after 20,000 claims and results). Past `limitFrames` frames, further PASSIVE passes
// bring what is left under `restartFrames`, then a RESTART checkpoint copies that rest,
// so the next commit starts the log over and cuts the file back (journal_size_limit).
// Meanwhile `flag` is up: this process's writer starts no transaction and waits for it to
// drop (Atomics.waitAsync), instead of failing on the lock and backing off. Its tries
// never sleep in SQLite's busy handler (which slept 1, 2, 5, 10 ms between tries while
// holding writers off, about 35 ms a restart); they go on for at most `restartWaitMs`,
// so a long reader elsewhere costs writers no more than that each `intervalMs`. Not
// TRUNCATE: a truncation by this thread made another connection of the process fail
// with SQLITE_IOERR_SHORT_READ.
// The thread checkpoints every `intervalMs`, and sooner when the log's file has grown
// past the limit: its size is looked at every `watchMs`. A claim loop writes the log at
// up to 500 MB/s on a fast disk, so waiting for the next turn alone let it reach 140 MB
// (four times the limit) before it was started over.
const checkpointerSource = `
  const { workerData, parentPort } = require("node:worker_threads")
  const { statSync } = require("node:fs")
  const Sqlite = require(workerData.module)
  const db = new Sqlite(workerData.filename, { timeout: 0 })
  const flag = workerData.flag
  // The log file's size past which it holds more than limitFrames frames (a 32-byte header, then frames of a page and 24 bytes).
  const limitBytes = 32 + workerData.limitFrames * (db.pragma("page_size", { simple: true }) + 24)
  // Whether the log is within its limit when the checkpoint ends (a RESTART that ran out of time leaves it over).
  const checkpoint = () => {
    try {
      let [r] = db.pragma("wal_checkpoint(PASSIVE)")
      if (r === undefined || r.log <= workerData.limitFrames) return true
      // Catch up first without holding the writer off: each pass copies what it added during the
      // one before. A pass that left more to copy than the one before (a writer faster than the
      // disk) ends the catching up: the RESTART then copies the rest with the writer held off.
      for (let i = 0; i < 4 && r.log - r.checkpointed > workerData.restartFrames; i++) {
        const left = r.log - r.checkpointed
        ;[r] = db.pragma("wal_checkpoint(PASSIVE)")
        if (r.log - r.checkpointed >= left) break
      }
      // The writer of this process starts no transaction while the flag is up (it waits for the
      // flag to drop), so a try fails only on a transaction already under way or on another process.
      Atomics.store(flag, 0, 1)
      try {
        const t0 = performance.now()
        let busy
        while ((busy = db.pragma("wal_checkpoint(RESTART)")[0].busy) && performance.now() - t0 < workerData.restartWaitMs) Atomics.wait(flag, 0, 1, 0.5)
        return !busy
      } finally {
        Atomics.store(flag, 0, 0)
        Atomics.notify(flag, 0)
      }
    } catch {
      return false
    }
  }
  const size = () => {
    try {
      return statSync(workerData.filename + "-wal").size
    } catch {
      return 0
    }
  }
  // When the last checkpoint ran, whether it left the log within its limit (one that did not
  // waits for the next turn, so that a reader elsewhere holds writers off at most restartWaitMs a
  // turn), and the file's size then: a log started over keeps its file's size until the next
  // commit cuts it back, so an idle store's file over the limit calls for no checkpoint.
  let last = performance.now()
  let within = true
  let checked = size()
  const timer = setInterval(() => {
    const now = performance.now()
    const bytes = now - last >= workerData.intervalMs ? -1 : size()
    if (bytes === -1 || (within && bytes > limitBytes && bytes !== checked)) {
      within = checkpoint()
      last = performance.now()
      checked = size()
    }
  }, workerData.watchMs)
  parentPort.once("message", () => { clearInterval(timer); checkpoint(); db.close(); parentPort.close() })`

/**
 * Frames the log may hold before a checkpoint starts it over (48 MB at 4 KB pages). At 1,000
 * (4 MB, SQLite's automatic checkpoint) the writers' waits for it cost about 15 % of a claim
 * loop's rate, at 8,000 (32 MB) about 9 % once the thread started the log over within 10 ms of
 * the limit (`npm run bench -- --only 7`, two runs each); at 12,000 the loop runs as fast as when
 * the thread only looked every quarter second (and let the log reach 140 MB), and the log peaks
 * at about 75 MB under constant writes.
 */
export const walLimitFrames = 12000

/**
 * Moves WAL checkpoints off the event loop: SQLite's automatic checkpoint runs inside
 * a COMMIT and copies pages and syncs the file there, seconds on a busy disk. It is
 * turned off on this connection and a worker thread checkpoints every 250 ms instead;
 * should the thread fail, the automatic checkpoint is turned back on.
 */
const checkpointer = (db: Sqlite.Database, filename: string): Effect.Effect<Restarts, never, Scope.Scope> =>
  Effect.map(
    Effect.acquireRelease(
      Effect.sync(() => {
        db.pragma("wal_autocheckpoint = 0")
        const flag = new Int32Array(new SharedArrayBuffer(4))
        const worker = new Worker(checkpointerSource, {
          eval: true,
          workerData: { module: createRequire(import.meta.url).resolve("better-sqlite3"), filename, flag, intervalMs: 250, watchMs: 10, limitFrames: walLimitFrames, restartFrames: 256, restartWaitMs: 50 }
        })
        worker.unref()
        worker.on("error", () => {
          Atomics.store(flag, 0, 0)
          if (db.open) db.pragma("wal_autocheckpoint = 1000")
        })
        return { worker, flag }
      }),
      ({ worker }) =>
        Effect.async<void>((resume) => {
          const timer = setTimeout(() => void worker.terminate().finally(() => resume(Effect.void)), 2000)
          worker.once("exit", () => {
            clearTimeout(timer)
            resume(Effect.void)
          })
          worker.postMessage("stop")
        })
    ),
    ({ flag }): Restarts => ({
      pending: () => Atomics.load(flag, 0) === 1,
      // Woken when the thread clears the flag; never later than its own bound (plus a margin).
      ended: Effect.async<void>((resume) => {
        const w = (Atomics as unknown as AtomicsWaitAsync).waitAsync(flag, 0, 1, 100)
        if (!w.async) return resume(Effect.void)
        // A pending waitAsync alone keeps no event loop alive: a timer does, until it settles.
        const alive = setTimeout(() => {}, 200)
        void (w.value as Promise<string>).then(() => {
          clearTimeout(alive)
          resume(Effect.void)
        })
      })
    })
  )

/** The checkpoint thread's RESTART, seen from the writer: whether one is under way, and its end. */
interface Restarts {
  readonly pending: () => boolean
  readonly ended: Effect.Effect<unknown>
}

// Node 20 has Atomics.waitAsync; the project's TypeScript library (ES2022) does not declare it.
interface AtomicsWaitAsync {
  readonly waitAsync: (a: Int32Array, index: number, value: number, timeoutMs: number) => { readonly async: boolean; readonly value: Promise<string> | string }
}

const noRestarts: Restarts = { pending: () => false, ended: Effect.void }
