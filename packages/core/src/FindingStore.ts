import { Chunk, Context, type Duration, Effect, Layer, Option, Stream } from "effect"
import type { Outcome } from "./Assignment.js"
import { NotFound, type StoreError } from "./Errors.js"
import * as Findings from "./Findings.js"
import * as MemoryOperations from "./MemoryOperations.js"
import * as MemoryStore from "./MemoryStore.js"
import * as Operations from "./Operations.js"
import type { Source } from "./Source.js"
import { Store, resultThenClaim } from "./Store.js"
import * as WorkerWrite from "./WorkerWrite.js"

/**
 * One page of a target's findings and scans (`forTarget`). Findings go in id order, scans in
 * reservation order, each list by its own keyset cursor. The first page (no cursor) starts both
 * lists; a page with `after` continues the findings only, one with `scansAfter` the scans only
 * (with both, both).
 */
export interface TargetQuery {
  readonly source: Source
  readonly identity: string
  /** The `next` of the previous page. */
  readonly after?: number
  /** The `nextScans` of the previous page. */
  readonly scansAfter?: number
  /** The most findings, and the most scans, one page holds. */
  readonly limit: number
}

/**
 * The most changes of one finding a target page carries: its newest. A finding that comes and
 * goes with every scan changes with every scan, so without a bound one page could carry a year of
 * scans per finding; `history` reads a finding's changes a page at a time.
 */
export const eventsPerFinding = 20

/** A page of a target's findings with the changes in their lives, and of its related scans (oldest first). */
export interface TargetFindings {
  readonly findings: ReadonlyArray<Findings.Finding>
  /** The changes in the lives of this page's findings, at most `eventsPerFinding` of each (its newest), oldest first. */
  readonly events: ReadonlyArray<Findings.Event>
  /** The ids of this page's findings that have older changes than `events` carries (read them with `history`), in id order. */
  readonly moreEvents: ReadonlyArray<number>
  readonly scans: ReadonlyArray<Findings.Scan>
  /** The cursor of the next page of findings (`after`); null when this page has the last one, or none. */
  readonly next: number | null
  /** The cursor of the next page of scans (`scansAfter`); null when this page has the last one, or none. */
  readonly nextScans: number | null
}

/** One finding's changes from a cursor on (`history`). */
export interface HistoryQuery {
  readonly findingId: number
  /** The `next` of the previous page: the reservation of the last change it held. */
  readonly after?: number
  /** The most changes one page holds. */
  readonly limit: number
}

/** A page of one finding's changes, oldest first. */
export interface History {
  readonly events: ReadonlyArray<Findings.Event>
  /** The cursor of the next page (`after`); null when this page has the last change. */
  readonly next: number | null
}

/** Which lists a target page holds: a cursor continues its own list only; no cursor starts both. */
export const targetPageParts = (q: Pick<TargetQuery, "after" | "scansAfter">): { readonly findings: boolean; readonly scans: boolean } => ({
  findings: q.after !== undefined || q.scansAfter === undefined,
  scans: q.scansAfter !== undefined || q.after === undefined
})

/** The order of a target page's events: by time, then reservation, then finding. */
export const eventOrder = (a: Findings.Event, b: Findings.Event): number => a.at - b.at || a.reservationId - b.reservationId || a.findingId - b.findingId

/**
 * The findings port: the rows that result acceptance writes (in the result's
 * own transaction) and the outbox it feeds. Reads only; the write belongs to
 * the Store's result acceptance, so a result and its findings commit together.
 */
export class FindingStore extends Context.Tag("@scanfleet/core/FindingStore")<
  FindingStore,
  {
    /** Findings matching the filters, in id order from the cursor on; at most `limit`. */
    readonly list: (q: Findings.ListQuery) => Effect.Effect<Findings.Page, StoreError>
    /** The newest findings (highest id first), at most `limit`: one bounded read whatever the number stored. */
    readonly newest: (limit: number) => Effect.Effect<ReadonlyArray<Findings.Finding>, StoreError>
    /** How many findings have each status, each counted up to `cap + 1` at most, so the read stays bounded: above `cap` reads as "more than cap". */
    readonly countByStatus: (cap: number) => Effect.Effect<Readonly<Record<Findings.Status, number>>, StoreError>
    /** One page of a target's findings with their newest changes, and of its scans; NotFound when it has no finding and no related scan at all. */
    readonly forTarget: (q: TargetQuery) => Effect.Effect<TargetFindings, NotFound | StoreError>
    /** One finding's changes in the order they happened (by reservation), a keyset page at a time; NotFound when there is no such finding. */
    readonly history: (q: HistoryQuery) => Effect.Effect<History, NotFound | StoreError>
    /** The summary of the scan one reservation delivered; null when it touched no finding (a failed scan, or a clean one of a target with none): read as zeros. */
    readonly scan: (reservationId: number) => Effect.Effect<Findings.Scan | null, StoreError>
    /** Outbox events after a position, in order; at most `limit`. */
    readonly outbox: (after: number, limit: number) => Effect.Effect<ReadonlyArray<Findings.OutboxEvent>, StoreError>
    /** A subscriber's position in the outbox: everything up to it was delivered or dead-lettered (0 at first). */
    readonly cursor: (subscriber: string) => Effect.Effect<number, StoreError>
    /** Moves a subscriber's position forward (never back). */
    readonly advance: (subscriber: string, seq: number) => Effect.Effect<void, StoreError>
    /** Records an event that exhausted its tries for a subscriber. */
    readonly deadLetter: (subscriber: string, letter: DeadLetter) => Effect.Effect<void, StoreError>
    /** A subscriber's dead letters, oldest event first. */
    readonly deadLetters: (subscriber: string) => Effect.Effect<ReadonlyArray<DeadLetter>, StoreError>
    /** Removes one dead letter and returns its event, for redelivery; null when there is no such letter. */
    readonly takeDeadLetter: (subscriber: string, seq: number) => Effect.Effect<Findings.OutboxEvent | null, StoreError>
  }
>() {}

/** An outbox event a subscriber could not take within its tries. */
export interface DeadLetter {
  readonly seq: number
  readonly attempts: number
  readonly lastError: string
  readonly at: number
}

/** The shape of a FindingStore implementation. */
export type FindingStoreShape = Context.Tag.Service<FindingStore>

/** What result acceptance hands the findings writer: the accepted scan and its target. */
export interface ScanInput {
  readonly reservationId: number
  readonly targetId: number
  readonly source: Source
  readonly identity: string
  readonly coveredRemoteAt: number | null
  readonly outcome: Outcome
  readonly now: number
  readonly body: string
}

/** The in-memory findings: the reference model the SQL adapters are checked against. */
export interface Memory extends FindingStoreShape {
  /** Records one accepted result (what the SQL writer does inside the result's transaction). */
  readonly record: (input: ScanInput) => void
}

/** Makes the in-memory model. */
export const makeMemory = (): Memory => {
  const rows: Array<Findings.Finding> = []
  const events: Array<Findings.Event> = []
  const scans: Array<Findings.Scan> = []
  const outbox: Array<Findings.OutboxEvent> = []
  const cursors = new Map<string, number>()
  const dead = new Map<string, Map<number, DeadLetter>>()
  const record = (input: ScanInput) => {
    if (!Findings.relates(input.outcome) || scans.some((s) => s.reservationId === input.reservationId)) return
    const accepted = Findings.fromBody(input.body)
    const mine = rows.filter((f) => f.targetId === input.targetId)
    const plan = Findings.relate(mine, accepted)
    if (Findings.isEmpty(plan)) return
    const revision = Findings.revisionOf(accepted, input.coveredRemoteAt)
    const at = input.now
    const changed: Array<Findings.OutboxEvent["findings"][number]> = []
    const note = (f: Findings.Finding, change: "new" | "resolved") =>
      changed.push({ id: f.id, change, detector: f.detector, path: f.path, line: f.line, fingerprint: f.fingerprint, preview: f.preview, verified: f.verified })
    for (const s of plan.seen) {
      const i = rows.findIndex((f) => f.id === s.id)
      const r = s.reported
      rows[i] = { ...rows[i], status: s.status, line: r.line, preview: r.preview, verified: r.verified, details: r.details, sealed: r.sealed ?? rows[i].sealed, lastSeenAt: at, lastRevision: revision, resolvedAt: null, resolvedRevision: null }
      if (s.reopened) {
        events.push({ findingId: s.id, reservationId: input.reservationId, kind: "reopened", revision, at })
        note(rows[i], "new")
      }
    }
    for (const id of plan.resolved) {
      const i = rows.findIndex((f) => f.id === id)
      rows[i] = { ...rows[i], status: "resolved", resolvedAt: at, resolvedRevision: revision }
      events.push({ findingId: id, reservationId: input.reservationId, kind: "resolved", revision, at })
      note(rows[i], "resolved")
    }
    for (const r of plan.inserts) {
      const f: Findings.Finding = {
        id: rows.length + 1,
        targetId: input.targetId,
        source: input.source,
        identity: input.identity,
        detector: r.detector,
        path: r.path,
        line: r.line,
        fingerprint: r.fingerprint,
        preview: r.preview,
        verified: r.verified,
        status: "new",
        firstSeenAt: at,
        lastSeenAt: at,
        firstRevision: revision,
        lastRevision: revision,
        resolvedAt: null,
        resolvedRevision: null,
        details: r.details,
        sealed: r.sealed
      }
      rows.push(f)
      events.push({ findingId: f.id, reservationId: input.reservationId, kind: "new", revision, at })
      note(f, "new")
    }
    const scan: Findings.Scan = { reservationId: input.reservationId, targetId: input.targetId, source: input.source, identity: input.identity, revision, at, ...plan.summary }
    scans.push(scan)
    if (changed.length > 0) outbox.push({ seq: outbox.length + 1, type: "scan.related", at, scan, findings: changed.sort((a, b) => a.id - b.id) })
  }
  return {
    record,
    list: (q) =>
      Effect.sync(() => {
        const limit = Math.max(0, Math.floor(q.limit))
        const hits = rows.filter((f) => (q.after === undefined || f.id > q.after) && Findings.matches(f, q))
        const page = hits.slice(0, limit)
        return { findings: page, next: hits.length > limit && page.length > 0 ? page[page.length - 1].id : null }
      }),
    newest: (limit) => Effect.sync(() => rows.slice(Math.max(0, rows.length - Math.max(0, Math.floor(limit)))).reverse()),
    countByStatus: (cap) =>
      Effect.sync(() => {
        const counts = Object.fromEntries(Findings.statuses.map((st) => [st, 0])) as Record<Findings.Status, number>
        for (const f of rows) counts[f.status] = Math.min(counts[f.status] + 1, Math.max(0, Math.floor(cap)) + 1)
        return counts
      }),
    forTarget: (q) =>
      Effect.suspend(() => {
        const limit = Math.max(0, Math.floor(q.limit))
        const parts = targetPageParts(q)
        const mine = rows.filter((f) => f.source === q.source && f.identity === q.identity)
        const theirScans = scans.filter((s) => s.source === q.source && s.identity === q.identity).sort((a, b) => a.reservationId - b.reservationId)
        if (mine.length === 0 && theirScans.length === 0) return Effect.fail(new NotFound({ entity: "target", key: `${q.source}:${q.identity}` }))
        const f = parts.findings ? mine.filter((x) => x.id > (q.after ?? 0)) : []
        const sc = parts.scans ? theirScans.filter((x) => x.reservationId > (q.scansAfter ?? 0)) : []
        const findings = f.slice(0, limit)
        const page = sc.slice(0, limit)
        const newest = (id: number) => events.filter((e) => e.findingId === id).sort((a, b) => b.reservationId - a.reservationId)
        const shown = findings.map((x) => newest(x.id))
        return Effect.succeed({
          findings,
          events: shown.flatMap((es) => es.slice(0, eventsPerFinding)).sort(eventOrder),
          moreEvents: findings.filter((_, i) => shown[i].length > eventsPerFinding).map((x) => x.id),
          scans: page,
          next: f.length > limit && findings.length > 0 ? findings[findings.length - 1].id : null,
          nextScans: sc.length > limit && page.length > 0 ? page[page.length - 1].reservationId : null
        })
      }),
    history: (q) =>
      Effect.suspend(() => {
        if (!rows.some((f) => f.id === q.findingId)) return Effect.fail(new NotFound({ entity: "finding", key: String(q.findingId) }))
        const limit = Math.max(0, Math.floor(q.limit))
        const mine = events.filter((e) => e.findingId === q.findingId && e.reservationId > (q.after ?? 0)).sort((a, b) => a.reservationId - b.reservationId)
        const page = mine.slice(0, limit)
        return Effect.succeed({ events: page, next: mine.length > limit && page.length > 0 ? page[page.length - 1].reservationId : null })
      }),
    scan: (reservationId) => Effect.sync(() => scans.find((s) => s.reservationId === reservationId) ?? null),
    outbox: (after, limit) => Effect.sync(() => outbox.filter((e) => e.seq > after).slice(0, Math.max(0, Math.floor(limit)))),
    cursor: (subscriber) => Effect.sync(() => cursors.get(subscriber) ?? 0),
    advance: (subscriber, seq) => Effect.sync(() => void cursors.set(subscriber, Math.max(cursors.get(subscriber) ?? 0, seq))),
    deadLetter: (subscriber, letter) =>
      Effect.sync(() => {
        const mine = dead.get(subscriber) ?? new Map<number, DeadLetter>()
        mine.set(letter.seq, letter)
        dead.set(subscriber, mine)
      }),
    deadLetters: (subscriber) => Effect.sync(() => [...(dead.get(subscriber)?.values() ?? [])].sort((a, b) => a.seq - b.seq)),
    takeDeadLetter: (subscriber, seq) =>
      Effect.sync(() => {
        const mine = dead.get(subscriber)
        if (mine === undefined || !mine.delete(seq)) return null
        return outbox.find((e) => e.seq === seq) ?? null
      })
  }
}

/**
 * The in-memory Store, its operator port and its findings, as one layer: every
 * result the Store accepts is recorded by the model in the same synchronous
 * step, as the SQL adapters record it in the result's transaction.
 */
export const layerMemory: Layer.Layer<Store | Operations.Operations | FindingStore> = Layer.effectContext(
  Effect.sync(() => {
    const inner = MemoryStore.make()
    const memory = makeMemory()
    const recordAfter = (input: { readonly reservationId: number; readonly now: number; readonly outcome: Outcome; readonly body: string }) =>
      Effect.flatMap(inner.getAssignment(input.reservationId), (a) =>
        Effect.flatMap(inner.getTarget(a.source, a.identity), (t) =>
          Effect.sync(() => memory.record({ reservationId: a.reservationId, targetId: t.id, source: a.source, identity: a.identity, coveredRemoteAt: a.coveredRemoteAt, outcome: input.outcome, now: input.now, body: input.body }))
        )
      ).pipe(Effect.orDie)
    const store = {
      ...inner,
      submitResult: (input: Parameters<typeof inner.submitResult>[0]) =>
        Effect.tap(inner.submitResult(input), (receipt) => (WorkerWrite.isRepeat(receipt) ? Effect.void : recordAfter(input))),
      submitResults: (inputs: Parameters<typeof inner.submitResults>[0]) =>
        Effect.tap(inner.submitResults(inputs), (answers) =>
          Effect.forEach(answers, (a, i) => (a._tag === "Right" && !WorkerWrite.isRepeat(a.right) ? recordAfter(inputs[i]) : Effect.void), { discard: true })
        )
    }
    const withClaim = { ...store, submitResultAndClaim: resultThenClaim(store) }
    // The operator port works on the model's state, which is keyed by the inner store.
    return Context.make(Store, withClaim).pipe(Context.add(Operations.Operations, MemoryOperations.make(inner)), Context.add(FindingStore, memory))
  })
)

/**
 * The outbox as an endless Stream: every event after `after`, in order, then
 * each new one as result acceptance commits it (polled every `pollInterval`,
 * default 1 second). For an embedding application; pair it with `cursor` and
 * `advance` to resume where it stopped. `Stream.toAsyncIterable` gives an async iterator.
 *
 * @example
 * yield* FindingStore.changes({ after: 0 }).pipe(Stream.take(10), Stream.runForEach((e) => Effect.log(e.scan)))
 */
export const changes = (opts: { readonly after?: number; readonly pollInterval?: Duration.DurationInput; readonly batch?: number } = {}): Stream.Stream<Findings.OutboxEvent, StoreError, FindingStore> =>
  Stream.unwrap(
    Effect.map(FindingStore, (f) =>
      Stream.unfoldChunkEffect(opts.after ?? 0, (pos) =>
        Effect.flatMap(f.outbox(pos, opts.batch ?? 100), (evs) =>
          evs.length === 0
            ? Effect.as(Effect.sleep(opts.pollInterval ?? "1 second"), Option.some([Chunk.empty<Findings.OutboxEvent>(), pos] as const))
            : Effect.succeed(Option.some([Chunk.fromIterable(evs), evs[evs.length - 1].seq] as const))
        )
      )
    )
  )
