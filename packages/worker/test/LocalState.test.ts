import { PhaseModel } from "@scanfleet/core"
import { Cli, LocalState } from "@scanfleet/worker"
import { Effect, FastCheck as fc } from "effect"
import { execFile } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import { afterAll, describe, expect, it } from "vitest"

const dir = mkdtempSync(join(tmpdir(), "scanfleet-localstate-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

// A child node process edits a state file behind the worker's back; asynchronously, since a
// synchronous spawn holds the test worker's event loop (3.9 s on a loaded 2-core machine), and
// vitest fails the run when its worker cannot answer for 60 s.
const editBehindTheWorker = (script: string) => promisify(execFile)(process.execPath, ["-e", script], { cwd: join(__dirname, "..", "..", "..") })

const view = (reservationId: number) => ({
  fleetId: "fleet-a",
  reservationId,
  fence: 1,
  deviceId: 1,
  slot: 0,
  target: { id: 1, source: "github" as const, identity: "acme/app", coveredRemoteAt: null },
  issuedAt: 0,
  deadlines: {
    targetScan: { label: "target-scan deadline", at: 1000, iso: new Date(1000).toISOString() },
    resultUpload: { label: "result-upload deadline", at: 2000, iso: new Date(2000).toISOString() },
    assignmentExpiry: { label: "assignment expiry", at: 3000, iso: new Date(3000).toISOString() }
  },
  nextDeadline: null,
  policy: { source: "github" as const, origin: "global" as const, ttlSeconds: 3, scanTimeoutSeconds: 1, uploadTimeoutSeconds: 1, handoffMarginSeconds: 1 },
  state: "active" as const,
  lastPhase: null,
  lastSeq: 0,
  lastProgressAt: null,
  outcome: null,
  finalPhase: null,
  endedAt: null,
  expiry: null,
  serverNow: 0
})

const record = (reservationId: number): LocalState.AssignmentRecord => ({
  fleetId: "fleet-a",
  reservationId,
  slot: 0,
  fence: 1,
  view: view(reservationId),
  clockOffsetMs: 0,
  deadlines: { scan: 1000, upload: 2000, expiry: 3000 },
  status: "running",
  phase: null,
  lastSeq: 0,
  runner: null,
  tmpDir: null,
  stageFile: null,
  outcome: null,
  finalPhase: null,
  receipt: null,
  note: null
})

let files = 0
describe("the local phase journal", () => {
  it("sequence numbers stay 1, 2, 3, ... across any interleaving of appends and restarts", async () => {
    // Each step: advance to a later phase (by a skip of 1..3), record a recovery, or reopen the file (a restart).
    const steps = fc.array(fc.oneof(fc.constant<"recover">("recover"), fc.constant<"restart">("restart"), fc.integer({ min: 1, max: 3 })), { minLength: 1, maxLength: 25 })
    await fc.assert(fc.asyncProperty(steps, async (steps) => {
      const file = join(dir, `prop-${++files}.db`)
      let s = await LocalState.open(file)
      try {
        await s.putAssignment(record(1))
        await s.append(1, { kind: "phase", phase: "assigned", at: 1 })
        let rank = 0
        const order = PhaseModel.phases.filter((p) => !PhaseModel.isTerminal(p))
        for (const step of steps) {
          if (step === "restart") {
            await s.close()
            s = await LocalState.open(file)
          } else if (step === "recover") await s.append(1, { kind: "recovered", phase: order[rank], at: 2 })
          else if (rank + step < order.length) {
            rank += step
            await s.append(1, { kind: "phase", phase: order[rank], at: 3 })
          }
        }
        const journal = await s.journal(1)
        expect(journal.map((e) => e.seq)).toEqual(journal.map((_, i) => i + 1))
        expect((await s.assignment(1))?.lastSeq).toBe(journal.length)
      } finally {
        await s.close()
      }
    }), { numRuns: 15 })
  })

  it("an illegal transition is refused and nothing is written", async () => {
    const s = await LocalState.open(join(dir, "illegal.db"))
    try {
      await s.putAssignment(record(7))
      await s.append(7, { kind: "phase", phase: "assigned", at: 1 })
      await s.append(7, { kind: "phase", phase: "scanning", at: 2 })
      await expect(s.append(7, { kind: "phase", phase: "preparing", at: 3 })).rejects.toMatchObject({ _tag: "JournalRefused", reason: "illegal_transition" })
      await s.append(7, { kind: "phase", phase: "timed_out", at: 4 })
      await expect(s.append(7, { kind: "recovered", phase: "timed_out", at: 5 })).rejects.toMatchObject({ reason: "terminal" })
      expect((await s.journal(7)).map((e) => e.phase)).toEqual(["assigned", "scanning", "timed_out"])
    } finally {
      await s.close()
    }
  })

  it("an open assignment is found however many finished ones came after it", async () => {
    const s = await LocalState.open(join(dir, "long-history.db"))
    try {
      await s.putAssignment({ ...record(1), status: "delivering" })
      for (let id = 2; id <= 1500; id++) await s.putAssignment({ ...record(id), status: "done" })
      expect((await s.assignments({ open: true })).map((a) => a.reservationId)).toEqual([1])
      expect(await s.assignments({ limit: 3 })).toHaveLength(3)
    } finally {
      await s.close()
    }
  })

  it("persisted state is parsed on load: a damaged row is set aside, never guessed at, and the rows beside it stay", async () => {
    const file = join(dir, "damaged.db")
    const s = await LocalState.open(file)
    await s.putAssignment(record(9))
    await s.putAssignment(record(10))
    await s.close()
    // Damage the row behind the worker's back, as a disk or a hand edit might.
    await editBehindTheWorker(
      `const D = require("better-sqlite3"); const db = new D(${JSON.stringify(file)}); db.prepare("UPDATE assignments SET doc = json_set(doc, '$.lastSeq', -5) WHERE reservation_id = 9").run(); db.close()`
    )
    const again = await LocalState.open(file)
    try {
      expect(await again.assignment(9)).toBeNull()
      expect((await again.assignments()).map((a) => a.reservationId)).toEqual([10])
      const { total, rows } = await again.damagedRows(10)
      expect(total).toBe(1)
      expect(rows[0]).toMatchObject({ table: "assignments", key: "fleet fleet-a, reservation 9", problem: "lastSeq: too_small" })
    } finally {
      await again.close()
    }
  })
})

describe("a state file written before fleets had ids", () => {
  it("is upgraded in place by the Migrator: its rows join the legacy fleet, and the first fleet the device registers with takes them over", async () => {
    const file = join(dir, "v1.db")
    // The schema and rows as the previous worker wrote them (PRAGMA user_version 3, keyed by reservation alone).
    const { fleetId: _f, view: v, ...old } = record(4)
    const { fleetId: _vf, ...oldView } = v
    const doc = JSON.stringify({ ...old, view: oldView, status: "delivering", phase: "awaiting_receipt", lastSeq: 2 })
    await editBehindTheWorker(
      `const D = require("better-sqlite3"); const db = new D(${JSON.stringify(file)});
       db.exec("CREATE TABLE slots (slot INTEGER PRIMARY KEY, doc TEXT NOT NULL)");
       db.exec("CREATE TABLE assignments (reservation_id INTEGER PRIMARY KEY, doc TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'running')");
       db.exec("CREATE TABLE events (reservation_id INTEGER NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, phase TEXT NOT NULL, at INTEGER NOT NULL, detail TEXT, delivery TEXT NOT NULL, acked_at INTEGER, error TEXT, PRIMARY KEY (reservation_id, seq))");
       db.exec("CREATE TABLE results (reservation_id INTEGER PRIMARY KEY, after_seq INTEGER NOT NULL, body TEXT NOT NULL, delivery TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, error TEXT, kind TEXT NOT NULL DEFAULT 'result')");
       db.prepare("INSERT INTO assignments (reservation_id, doc, status) VALUES (4, ?, 'delivering')").run(${JSON.stringify(doc)});
       db.prepare("INSERT INTO events VALUES (4, 1, 'phase', 'assigned', 1, NULL, 'acked', 2, NULL)").run();
       db.prepare("INSERT INTO events VALUES (4, 2, 'phase', 'awaiting_receipt', 3, NULL, 'pending', NULL, NULL)").run();
       db.prepare("INSERT INTO slots VALUES (0, ?)").run(JSON.stringify({ slot: 0, reservationId: 4, updatedAt: 5 }));
       db.pragma("user_version = 3"); db.close()`
    )

    const s = await LocalState.open(file)
    try {
      const [a] = await s.assignments()
      expect(a).toMatchObject({ fleetId: LocalState.legacyFleet, reservationId: 4, status: "delivering", lastSeq: 2 })
      expect((await s.journal(a)).map((e) => [e.seq, e.phase, e.delivery])).toEqual([[1, "assigned", "acked"], [2, "awaiting_receipt", "pending"]])
      expect(await s.slots()).toEqual([{ slot: 0, fleetId: LocalState.legacyFleet, reservationId: 4, updatedAt: 5 }])
    } finally {
      await s.close()
    }
    // Registering with a fleet while the file knows no other: the legacy rows are that fleet's.
    await Effect.runPromise(
      Effect.provide(Effect.flatMap(LocalState.State, (st) => st.sawFleet("fleet-new", "http://127.0.0.1:1", 10)), LocalState.layer(file))
    )
    const again = await LocalState.open(file)
    try {
      const key = { fleetId: "fleet-new", reservationId: 4 }
      expect(await again.assignment(key)).toMatchObject({ fleetId: "fleet-new", view: { fleetId: "fleet-new" } })
      expect((await again.journal(key)).map((e) => e.seq)).toEqual([1, 2])
      expect(await again.outboxReservations("fleet-new")).toEqual([key])
      expect(await again.fleets()).toEqual([{ fleetId: "fleet-new", server: "http://127.0.0.1:1", lastSeenAt: 10, assignments: 1, open: 1, undelivered: 1 }])
    } finally {
      await again.close()
    }
    // A second fleet takes nothing over: its own reservation 4 is another assignment.
    await Effect.runPromise(Effect.provide(Effect.flatMap(LocalState.State, (st) => st.sawFleet("fleet-other", "http://127.0.0.1:2", 20)), LocalState.layer(file)))
    const third = await LocalState.open(file)
    try {
      expect(await third.assignment({ fleetId: "fleet-other", reservationId: 4 })).toBeNull()
      expect((await third.fleets()).map((f) => f.fleetId)).toEqual(["fleet-other", "fleet-new"])
    } finally {
      await third.close()
    }
  })
})

describe("a state file written before fleets had ids, with rows that are not JSON", () => {
  it("is still taken over by the first fleet it meets; its unreadable rows are set aside when read", async () => {
    const file = join(dir, "v1-damaged.db")
    const { fleetId: _f, view: v, ...old } = record(4)
    const { fleetId: _vf, ...oldView } = v
    const doc = JSON.stringify({ ...old, view: oldView, status: "done", phase: "completed", lastSeq: 1 })
    // A migrated legacy file whose slot row and an assignment row were damaged afterwards.
    const legacy = await LocalState.open(file)
    await legacy.close()
    await editBehindTheWorker(
      `const D = require("better-sqlite3"); const db = new D(${JSON.stringify(file)});
       db.prepare("INSERT INTO assignments (fleet_id, reservation_id, doc, status) VALUES ('legacy', 4, ?, 'done')").run(${JSON.stringify(doc)});
       db.prepare("INSERT INTO assignments (fleet_id, reservation_id, doc, status) VALUES ('legacy', 5, '{not json', 'done')").run();
       db.prepare("INSERT INTO slots VALUES (0, 'not json either')").run(); db.close()`
    )
    await Effect.runPromise(Effect.provide(Effect.flatMap(LocalState.State, (st) => st.sawFleet("fleet-new", "http://127.0.0.1:1", 10)), LocalState.layer(file)))
    const s = await LocalState.open(file)
    try {
      expect((await s.assignments()).map((a) => [a.fleetId, a.reservationId, a.view.fleetId])).toEqual([["fleet-new", 4, "fleet-new"]])
      expect(await s.slots()).toEqual([])
      expect((await s.damagedRows(10)).rows.map((r) => [r.table, r.key])).toEqual([
        ["slots", "slot 0"],
        ["assignments", "fleet fleet-new, reservation 5"]
      ])
    } finally {
      await s.close()
    }
  })
})

describe("the history view", () => {
  it("a refused event is shown with the server's reason, as a refused result is", async () => {
    const file = join(dir, `history-${++files}.db`)
    const reason = "403 reservation_refused:not_active: reservation 15 is completed"
    await Effect.runPromise(
      Effect.provide(
        Effect.flatMap(LocalState.State, (st) =>
          Effect.gen(function* () {
            yield* st.putAssignment(record(15))
            const k = { fleetId: "fleet-a", reservationId: 15 }
            yield* st.append(k, { kind: "phase", phase: "assigned", at: 10 })
            yield* st.append(k, { kind: "recovered", phase: "assigned", at: 20, detail: "the controller restarted" })
            yield* st.markEvents(k, [1], "acked", 30)
            yield* st.markEvents(k, [2], "refused", 40, reason)
          })
        ),
        LocalState.layer(file)
      )
    )
    const state = await LocalState.open(file)
    try {
      const lines = (await Cli.renderHistory(state, { limit: 5 }, 50)).split("\n")
      expect(lines.find((l) => l.includes("#  2"))).toContain(`[refused] ${reason}`)
      expect(lines.find((l) => l.includes("#  1"))).not.toContain("refused")
    } finally {
      await state.close()
    }
  })
})
