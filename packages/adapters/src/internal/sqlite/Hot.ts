import type Sqlite from "better-sqlite3"
import { Effect, Either } from "effect"
import { Assignment, Claim, type Config, Deadline, Errors, Findings, type PhaseModel, Priority, Store, Target, WorkerWrite } from "@scanfleet/core"
import * as Codec from "../Codec.js"
import * as Policies from "../Policies.js"
import { mapped, toStoreError } from "../SqlErrors.js"
import type { Database } from "./Connection.js"

type Row = Record<string, unknown>
type Values = ReadonlyArray<unknown>

// Ids are integers in every table; anything else can only miss, as in core's model.
const isId = (n: number) => Number.isSafeInteger(n)

/** A refusal decided inside a synchronous transaction: thrown to roll it back, caught outside. */
class Refusal<E> {
  constructor(readonly error: E) {}
}

/**
 * A result whose findings must be related (it carries findings, or its target has open ones):
 * thrown as a Refusal's error to roll the synchronous transaction back before it wrote anything,
 * and the result goes to the SqlClient path, which relates findings in its own transaction.
 */
class Declined {}
const declined = new Declined()
const isDeclined = (e: unknown): e is Declined => e instanceof Declined

/**
 * The hot operations of the SQLite Store (claims, results, progress, observations)
 * as prepared better-sqlite3 statements, one set per operation, each operation one
 * synchronous IMMEDIATE transaction. The decisions are core's (Claim, Deadline,
 * WorkerWrite, Target); these functions read what they need and write what they decide.
 * Results that relate findings (core's `Findings.carriesFindings`, or a target with open
 * findings) are left to `slow`, the SqlClient Store, which writes them with the result.
 * A reservation references its configuration's policy row, interned by the claim's own
 * transaction the first time (so it waits for the write lock no longer than the claim).
 */
export const make = (database: Database, slow: Pick<Store.StoreShape, "submitResult" | "submitResults">) => {
  const db = database.db
  const st = statements(db)
  // Ids put in only once the transaction that interned them committed.
  const policies = Policies.cache()

  // One better-sqlite3 transaction function per operation, made once: `f` runs inside
  // BEGIN IMMEDIATE ... COMMIT, and a thrown Refusal rolls back and fails with its error.
  // Run at once when the connection is free (the common case: no Effect steps beyond one),
  // else in turn, retrying while another process holds the write lock.
  // `after` shapes the committed answer (in the same Effect step on the common path).
  const transaction = <I, A, E, B = A>(f: (input: I) => A, after?: (a: A, input: I) => B) => {
    const tx = db.transaction(f)
    const once = (input: I): Either.Either<A, E> => {
      try {
        return Either.right(tx.immediate(input))
      } catch (e) {
        if (e instanceof Refusal) return Either.left(e.error as E)
        throw e
      }
    }
    const shape = after ?? ((a: A) => a as unknown as B)
    const queued = (input: I, until?: number): Effect.Effect<B, E | Errors.StoreError> =>
      mapped(Effect.flatMap(database.run(() => once(input), until === undefined ? undefined : { until }), (r) => Either.map(r, (a) => shape(a, input))))
    return (input: I, until?: number): Effect.Effect<B, E | Errors.StoreError> =>
      Effect.suspend(() => {
        const now = database.runNow(() => once(input))
        if (now === undefined) return queued(input, until)
        if (Either.isLeft(now)) return Effect.fail(toStoreError(now.left))
        const r = now.right
        return Either.isRight(r) ? Effect.succeed(shape(r.right, input)) : Effect.fail(r.left)
      })
  }

  // The policy ids a claim interned, remembered once its transaction committed.
  type Claimed = { readonly issued: ReadonlyArray<Assignment.Assignment>; readonly interned: Policies.Interned | undefined }
  const issuedBy = (r: Claimed, req: Store.ClaimManyRequest) => {
    if (r.interned !== undefined) policies.put(req.config, r.interned)
    return r.issued
  }
  const claimTx = transaction<Store.ClaimManyRequest, Claimed, Errors.ClaimRejected, ReadonlyArray<Assignment.Assignment>>(claimSlots, issuedBy)
  const claimOneTx = transaction<Store.ClaimManyRequest, Claimed, Errors.ClaimRejected, Assignment.Assignment | null>(claimSlots, (r, req) => issuedBy(r, req)[0] ?? null)
  // A refusal is thrown: nothing was written before the judgement, so rolling back loses nothing.
  const resultTx = transaction<Store.ResultInput, Assignment.Receipt, Errors.ReservationRefused | Declined>((input) => {
    const r = submitOne(input)
    if (Either.isLeft(r)) throw new Refusal(r.left)
    return r.right
  })
  const resultsTx = transaction<ReadonlyArray<Store.ResultInput>, ReadonlyArray<Either.Either<Assignment.Receipt, Errors.ReservationRefused>>, Declined>((inputs) => inputs.map(submitOne))
  // A result, then the claim of the device's next slot in a savepoint of the same transaction: a
  // refused claim rolls back to the savepoint only, and the result stays.
  const claimInSavepoint = db.transaction(claimSlots)
  type Paired = { readonly input: Store.ResultInput; readonly next: Store.NextClaim }
  type PairedDone = { readonly receipt: Assignment.Receipt; readonly claimed: Claimed | null; readonly refused: Errors.ClaimRejected | null }
  const claimAfterResult = (p: Paired): Store.ClaimManyRequest => ({ ...p.next, deviceId: p.input.deviceId, now: p.input.now, slots: [p.next.slot] })
  const resultAndClaimTx = transaction<Paired, PairedDone, Errors.ReservationRefused | Declined, Store.ResultAndClaim>(
    (p) => {
      const r = submitOne(p.input)
      if (Either.isLeft(r)) throw new Refusal(r.left)
      try {
        return { receipt: r.right, claimed: claimInSavepoint(claimAfterResult(p)), refused: null }
      } catch (e) {
        if (e instanceof Refusal && e.error instanceof Errors.ClaimRejected) return { receipt: r.right, claimed: null, refused: e.error }
        throw e
      }
    },
    (done, p) => ({ receipt: done.receipt, next: done.claimed === null ? null : (issuedBy(done.claimed, claimAfterResult(p))[0] ?? null), claimRefused: done.refused })
  )
  const progressTx = transaction<
    { readonly auth: Store.Authority; readonly batch: ReadonlyArray<PhaseModel.Event> },
    { readonly results: ReadonlyArray<Store.Acceptance>; readonly assignment: Assignment.Assignment },
    Errors.ReservationRefused | Errors.ProgressRejected
  >(({ auth, batch }) => progress(auth, batch))
  const recordTx = transaction<{ readonly batch: ReadonlyArray<Target.Observation>; readonly now: number }, Store.RecordResult, never>(({ batch, now }) => record(batch, now))

  // A claim waits for another process's write lock no longer than its client does.
  const claimTransaction = <A>(tx: (req: Store.ClaimManyRequest, until?: number) => Effect.Effect<A, Errors.ClaimRejected | Errors.StoreError>) => (req: Store.ClaimManyRequest) =>
    Effect.catchIf(
      tx(req, req.notAfter),
      (e): e is Errors.StoreError => e._tag === "StoreError" && e.reason === "conflict" && req.notAfter !== undefined && Date.now() > req.notAfter,
      () => Effect.fail(Claim.deadlinePassed(req.notAfter!))
    )
  const claimOne = claimTransaction(claimOneTx)
  const claimMany = claimTransaction(claimTx)

  // Policy rows never change (a configuration's are interned, then only referenced): decoded once by id.
  const policyById = new Map<number, Config.EffectivePolicy>()
  const policyOf = (id: number): Config.EffectivePolicy => {
    let p = policyById.get(id)
    if (p === undefined) {
      p = Codec.json<Config.EffectivePolicy>(st.policy.get(id))
      if (policyById.size >= 256) policyById.delete(policyById.keys().next().value!)
      policyById.set(id, p)
    }
    return p
  }
  const loadAssignment = (reservationId: number): Assignment.Assignment | undefined => {
    if (!isId(reservationId)) return undefined
    const v = st.assignment.get(reservationId) as Values | undefined
    return v && Codec.assignmentAt(v, 0, policyOf(Number(v[Codec.assignmentPolicyId])))
  }
  // A result's reservation, its target and whether the target has open findings, in one read.
  const loadForResult = (reservationId: number) => {
    if (!isId(reservationId)) return undefined
    const v = st.forResult.get(reservationId) as Values | undefined
    return (
      v && {
        a: Codec.assignmentAt(v, 0, policyOf(Number(v[Codec.assignmentPolicyId]))),
        target: Codec.targetAt(v, Codec.assignmentWidth),
        openFindings: v[Codec.assignmentWidth + Codec.targetWidth] === 1
      }
    )
  }

  // A configuration's policy ids, its rows inserted if absent, in the caller's write transaction.
  function intern(config: Store.ClaimManyRequest["config"]): Policies.Interned {
    const { rows } = Policies.rowsOf(config)
    const found = rows.map((r) => {
      const key = [r.source, r.policy, r.scanMs, r.uploadMs, r.expiryMs] as const
      st.internPolicy.run(...key)
      return { id: st.policyId.get(...key), source: r.source }
    })
    return Policies.internedOf(rows, found)
  }

  function claimSlots(req: Store.ClaimManyRequest): Claimed {
    // Built only when refused: an error captures a stack trace.
    const unknown = () => new Refusal(new Errors.ClaimRejected({ reason: "unknown_device", message: `device ${req.deviceId} is not registered or was revoked` }))
    if (!isId(req.deviceId)) throw unknown()
    // One row per active reservation of the device (its slot), or one with a null slot when it has none.
    const held = st.device.all(req.deviceId) as Array<[slots: number, revokedAt: number | null, slot: number | null, reservationId: number, fence: number]>
    if (held.length === 0 || held[0][1] !== null) throw unknown()
    const d = { slots: held[0][0] }
    const busy: Array<Claim.Held> = []
    for (const r of held) if (r[2] !== null) busy.push({ slot: r[2], reservationId: r[3], fence: r[4] })
    const refused = Claim.refuseSlots(d.slots, busy, req.slots)
    if (refused) throw new Refusal(refused)
    const known = policies.get(req.config)
    if (req.slots.length === 0) return { issued: [], interned: undefined }
    // A cap of zero or less leaves nothing to take; otherwise each claim is stored before the next counts.
    if (req.sourceCap !== undefined && req.sourceCap <= 0) return { issued: [], interned: undefined }
    let fresh: Policies.Interned | undefined
    const filtered = req.sources !== undefined || req.sourceCap !== undefined
    const params = filtered ? { now: req.now, sources: req.sources === undefined ? null : JSON.stringify(req.sources), cap: req.sourceCap ?? null } : { now: req.now }
    const issued: Array<Assignment.Assignment> = []
    for (const slot of req.slots) {
      const row = (filtered ? st.pickFiltered : st.pick).get(params) as Values | undefined
      if (row === undefined) break
      const t = Codec.targetAt(row, 0)
      const { policy, deadlines } = Deadline.issueFor(req.config, t.source, req.now)
      // every configured source has its row, and Deadline.issueFor above refuses any other
      const policyId = (known ?? (fresh ??= intern(req.config))).bySource.get(t.source)!
      const reservationId = Number(
        st.reserve.run(t.id, t.source, t.identity, req.deviceId, d.slots, slot, t.fence, policyId, t.coveredRemoteAt, deadlines.issuedAt, deadlines.scanDeadline, deadlines.uploadDeadline, deadlines.expiresAt).lastInsertRowid
      )
      issued.push(Assignment.issued(t, { reservationId, deviceId: req.deviceId, slot }, policy, deadlines))
    }
    // Last, just before COMMIT: a claim whose client stopped waiting is rolled back, not committed.
    const late = Claim.pastDeadline(req.notAfter, Date.now())
    if (late) throw new Refusal(late)
    return { issued, interned: fresh }
  }

  // One result, inside the caller's transaction: core judges, then the writes of an accepted result.
  function submitOne(input: Store.ResultInput): Either.Either<Assignment.Receipt, Errors.ReservationRefused> {
    const read = loadForResult(input.reservationId)
    const judged = WorkerWrite.judgeResult(input, read?.a, () => read!.target)
    if (Either.isLeft(judged)) return Either.left(judged.left)
    if (judged.right._tag === "repeat") return Either.right(judged.right.receipt)
    const { receipt, targetStatus, state } = judged.right
    const x = read!.a
    // Nothing written yet: a target whose open findings this result may resolve goes to the slow path.
    if (read!.openFindings) throw new Refusal(declined)
    if (targetStatus === "completed") st.completeTarget.run(input.now, x.targetId, x.fence)
    else st.failTarget.run(targetStatus, x.targetId, x.fence)
    st.end.run(state, input.outcome, input.finalPhase, input.now, input.body, x.reservationId)
    // Its durations are folded later from the ended row and its timeline (migration 0011).
    st.pending.run(x.reservationId)
    return Either.right(receipt)
  }

  function progress(auth: Store.Authority, batch: ReadonlyArray<PhaseModel.Event>) {
    const authorized = WorkerWrite.authorize(auth, loadAssignment(auth.reservationId))
    if (Either.isLeft(authorized)) throw new Refusal(authorized.left)
    const a = authorized.right
    // Only events at or before the stored end can be duplicates: read those alone (none for a fresh batch).
    let lo = Number.POSITIVE_INFINITY
    let hi = 0
    for (const e of batch)
      if (isId(e.seq) && e.seq <= a.lastSeq) {
        lo = Math.min(lo, e.seq)
        hi = Math.max(hi, e.seq)
      }
    const stored = hi === 0 ? [] : (st.events.all(a.reservationId, lo, hi) as Array<Row>).map(Codec.event)
    const plan = WorkerWrite.planProgress(a, stored, batch, auth.now)
    if (Either.isLeft(plan)) throw new Refusal(plan.left)
    const { fresh, assignment, results } = plan.right
    if (fresh.length > 0) {
      for (const e of fresh) st.insertEvent.run(a.reservationId, e.seq, e.kind, e.phase, e.at, e.detail ?? null, e.acceptedAt)
      st.bump.run(assignment.lastPhase, assignment.lastSeq, assignment.lastProgressAt, a.reservationId)
    }
    return { results, assignment }
  }

  function record(batch: ReadonlyArray<Target.Observation>, now: number): Store.RecordResult {
    if (batch.length === 0) return { inserted: [], known: 0 }
    // One row per target in order of first appearance, merged as core's Target.observe merges repeats.
    const rows = new Map<string, { source: string; identity: string; remoteAt: number | null }>()
    for (const o of batch) {
      const key = `${o.source}\u0000${o.identity}`
      const prior = rows.get(key)
      rows.set(key, prior ? { ...prior, remoteAt: Target.mergeObserved(prior.remoteAt, o.remoteAt) } : { source: o.source, identity: o.identity, remoteAt: o.remoteAt })
    }
    // Under the write lock, ids above the previous maximum are the rows this batch inserted.
    const top = st.topId.get() as number
    const inserted: Array<string> = []
    for (const r of rows.values()) {
      const id = st.upsert.get(r.source, r.identity, r.remoteAt, now) as number | undefined
      if (id !== undefined && id > top) inserted.push(r.identity)
    }
    return { inserted, known: batch.length - inserted.length }
  }

  const hot = {
    claim: (req: Store.ClaimRequest) => claimOne({ ...req, slots: [req.slot] }),
    claimMany,
    submitResult: (input: Store.ResultInput) =>
      Findings.carriesFindings(input.outcome, input.body) ? slow.submitResult(input) : Effect.catchIf(resultTx(input), isDeclined, () => slow.submitResult(input)),
    // One transaction for the batch: each result judged after the ones before it, as one at a time;
    // a batch with a result that relates findings goes whole to the slow path, which keeps that order.
    submitResults: (inputs: ReadonlyArray<Store.ResultInput>) =>
      inputs.some((i) => Findings.carriesFindings(i.outcome, i.body)) ? slow.submitResults(inputs) : resultsTx(inputs).pipe(Effect.catchIf(isDeclined, () => slow.submitResults(inputs))),
    // One transaction for both; the two calls in turn where the result relates findings (the slow
    // path writes them) or the claim has a client deadline (a wait for the write lock ends there).
    submitResultAndClaim: (input: Store.ResultInput, next: Store.NextClaim) =>
      Findings.carriesFindings(input.outcome, input.body) || next.notAfter !== undefined
        ? apart(input, next)
        : Effect.catchIf(resultAndClaimTx({ input, next }), isDeclined, () => apart(input, next)),
    appendProgress: (auth: Store.Authority, batch: ReadonlyArray<PhaseModel.Event>) => progressTx({ auth, batch }),
    recordObservations: (batch: ReadonlyArray<Target.Observation>, now: number) => recordTx({ batch, now })
  } satisfies Partial<Store.StoreShape>
  const apart = Store.resultThenClaim(hot)
  return hot
}

// The statement set of the hot operations, prepared once per connection.
const statements = (db: Sqlite.Database) => {
  const claimSet = `status = 'in_progress', covered_remote_at = observed_remote_at, fence = fence + 1, last_scan_started_at = @now, attempts = attempts + 1`
  return {
    device: db
      .prepare("SELECT d.slots, d.revoked_at, a.slot, a.reservation_id, a.fence FROM devices d LEFT JOIN assignments a ON a.device_id = d.id AND a.state = 'active' WHERE d.id = ?")
      .raw(true),
    // core's Claim.claim in one statement on the first pending target in claim order (Priority).
    pick: db.prepare(`
      UPDATE targets SET ${claimSet}
      WHERE status = 'pending' AND id = (SELECT c.id FROM targets c WHERE c.status = 'pending' ORDER BY ${Priority.claimKeySql("c")}, c.id LIMIT 1)
      RETURNING ${Codec.targetColumns}`).raw(true),
    pickFiltered: db.prepare(`
      UPDATE targets SET ${claimSet}
      WHERE status = 'pending' AND id = (
        SELECT c.id FROM targets c
        WHERE c.status = 'pending'
          AND (@sources IS NULL OR c.source IN (SELECT value FROM json_each(@sources)))
          AND (@cap IS NULL OR c.source NOT IN (
            SELECT a.source FROM assignments a WHERE a.state = 'active' GROUP BY a.source HAVING count(*) >= @cap))
        ORDER BY ${Priority.claimKeySql("c")}, c.id LIMIT 1)
      RETURNING ${Codec.targetColumns}`).raw(true),
    reserve: db.prepare(`
      INSERT INTO assignments (target_id, source, identity, device_id, device_slots, slot, fence, policy_id, covered_remote_at,
        issued_at, scan_deadline, upload_deadline, expires_at, state)
      VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'active')`),
    // Rows of values (`raw`), decoded by position: an object per row costs more than the read.
    assignment: db.prepare(`SELECT ${Codec.assignmentFields("assignments")} FROM assignments WHERE reservation_id = ?`).raw(true),
    policy: db.prepare("SELECT policy FROM policies WHERE id = ?").pluck(),
    forResult: db
      .prepare(`
        SELECT ${Codec.assignmentFields("a")}, ${Codec.targetFields("t")},
          EXISTS (SELECT 1 FROM findings f WHERE f.target_id = a.target_id AND f.status <> 'resolved')
        FROM assignments a JOIN targets t ON t.id = a.target_id WHERE a.reservation_id = ?`)
      .raw(true),
    internPolicy: db.prepare("INSERT INTO policies (source, policy, scan_ms, upload_ms, expiry_ms) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"),
    policyId: db.prepare("SELECT id FROM policies WHERE source = ? AND policy = ? AND scan_ms = ? AND upload_ms = ? AND expiry_ms = ?").pluck(),
    completeTarget: db.prepare("UPDATE targets SET status = 'completed', completed_at = ? WHERE id = ? AND status = 'in_progress' AND fence = ?"),
    failTarget: db.prepare("UPDATE targets SET status = ? WHERE id = ? AND status = 'in_progress' AND fence = ?"),
    pending: db.prepare("INSERT INTO duration_pending (reservation_id) VALUES (?)"),
    end: db.prepare("UPDATE assignments SET state = ?, outcome = ?, final_phase = ?, ended_at = ?, result_body = ? WHERE reservation_id = ?"),
    events: db.prepare("SELECT seq, kind, phase, at, detail, accepted_at FROM progress_events WHERE reservation_id = ? AND seq BETWEEN ? AND ? ORDER BY seq"),
    insertEvent: db.prepare("INSERT INTO progress_events (reservation_id, seq, kind, phase, at, detail, accepted_at) VALUES (?, ?, ?, ?, ?, ?, ?)"),
    bump: db.prepare("UPDATE assignments SET last_phase = ?, last_seq = ?, last_progress_at = ? WHERE reservation_id = ?"),
    topId: db.prepare("SELECT COALESCE(MAX(id), 0) FROM targets").pluck(),
    // SQLite's two-argument MAX() is NULL if either side is, so the WHERE does the null handling.
    upsert: db
      .prepare(`
        INSERT INTO targets (source, identity, status, observed_remote_at, discovered_at) VALUES (?, ?, 'pending', ?, ?)
        ON CONFLICT (source, identity) DO UPDATE
          SET observed_remote_at = MAX(COALESCE(targets.observed_remote_at, excluded.observed_remote_at), excluded.observed_remote_at)
          WHERE excluded.observed_remote_at IS NOT NULL
            AND (targets.observed_remote_at IS NULL OR excluded.observed_remote_at > targets.observed_remote_at)
        RETURNING id`)
      .pluck()
  }
}
