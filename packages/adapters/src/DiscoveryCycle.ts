import { Clock, Console, Effect, Either } from "effect"
import { Discovery, LogLine as Log, Source, type Config, type Errors, type Store, type Target } from "@scanfleet/core"
import type { Page, SourceClient, SourceError, SourceRecord } from "./sources/SourceClient.js"

/** The settings of one cycle: its hard bounds and the managed configuration in force. */
export interface Settings {
  readonly limits: Discovery.Limits
  /** The source's promotion budget, cooldown and updated-rescans switch come from here. */
  readonly config: Config.ManagedConfig
  /** The promotion to run (default `store.promote`); a server instance passes one fenced by its discovery lease. */
  readonly promote?: Store.StoreShape["promote"]
}

/** The structured log line one cycle emits (also what the durable record holds), in the one log schema (`LogLine` of core). */
export interface LogLine {
  readonly time: string
  readonly level: "info" | "warning"
  readonly message: "discovery_cycle"
  readonly source: Source.Source
  readonly cycleId: number
  readonly startedAt: string
  readonly endedAt: string
  readonly pages: number
  readonly results: number
  readonly malformed: number
  readonly queued_new_count: number
  readonly queued_updated_count: number
  readonly deferred: number
  readonly stop_reason: Discovery.StopReason
  readonly error: string | null
}

/** The longest error a cycle record keeps: the failed listings' errors, joined, cut there. */
export const maxErrorLength = 2000

// Keeps the newest timestamp when a page names an identity twice, so one batch holds one row per target.
const dedupe = (records: ReadonlyArray<SourceRecord>): Array<SourceRecord> => {
  const m = new Map<string, SourceRecord>()
  for (const r of records) {
    const seen = m.get(r.identity)
    if (!seen || (r.remoteAt ?? -Infinity) > (seen.remoteAt ?? -Infinity)) m.set(r.identity, r)
  }
  return [...m.values()]
}

// JSON lines of the one log schema, whatever program runs the cycle; a cycle that ended in an error is a warning.
const line = (message: string, level: Log.Level, fields: Record<string, unknown>) =>
  Effect.flatMap(Clock.currentTimeMillis, (time) => Console.log(Log.format({ time, level, message, fields }, "json")))

/**
 * Runs one bounded discovery cycle of one source: walks its listings page by
 * page, the listings taking turns (recording each page's observations in one
 * batch), stops on the hard page and result limits (or ends a listing, with
 * updated rescans disabled, on a page of only known identities), runs the
 * budgeted promotion, writes the durable cycle record and emits one JSON log
 * line with the same counts.
 *
 * A source failure (malformed page, exhausted retries, a rate limit longer
 * than allowed, a next-page link back to a page already read, a client that
 * throws) ends that listing; the others go on, and the cycle's stop reason is
 * `error` with every failed listing's error. What was recorded stays, and the
 * promotion still runs over it. Store failures fail the effect.
 *
 * @example
 * const cycle = yield* DiscoveryCycle.run(client, store, { limits: { maxPages: 10, maxResults: 1000 }, config }, Date.now())
 */
export const run = (
  client: SourceClient,
  store: Store.StoreShape,
  settings: Settings,
  now: number
): Effect.Effect<Discovery.Cycle, Errors.StoreError> =>
  Effect.gen(function* () {
    const source = client.source
    const policy: Config.SourcePolicy = settings.config.sources[source]
    const { limits } = settings
    const clockStart = yield* Clock.currentTimeMillis
    const inserted = new Set<string>()
    let pages = 0
    let results = 0
    let malformed = 0
    let stopReason: Discovery.StopReason = "end_of_listing"
    let error: string | null = null

    // The listings take turns, one page each, so a long first listing cannot use the
    // whole page budget; each keeps its own cursor and the next-page links it has followed.
    const walks = client.listings.map(() => ({ cursor: null as string | null, done: false, followed: new Set<string>() }))
    const errors: Array<string> = []
    let limit: Discovery.StopReason | null = null
    rounds: while (walks.some((w) => !w.done)) {
      for (let listing = 0; listing < walks.length; listing++) {
        const walk = walks[listing]
        if (walk.done) continue
        if (pages >= limits.maxPages) {
          limit = "page_limit"
          break rounds
        }
        if (results + malformed >= limits.maxResults) {
          limit = "result_limit"
          break rounds
        }
        const name = client.listings[listing]
        // A failed listing ends itself, not the cycle; so does a client that throws.
        const fetched: Either.Either<Page, string> = yield* client.fetchPage(listing, walk.cursor, now, limits.maxResults - results - malformed).pipe(
          Effect.map((page) => Either.right(page)),
          Effect.catchAll((e: SourceError) => Effect.succeed(Either.left(`${e.reason}: ${e.message} (${e.url})`))),
          Effect.catchAllDefect((d) => Effect.succeed(Either.left(`client_failure: the ${source} client failed: ${d instanceof Error ? d.message : String(d)}`)))
        )
        if (fetched._tag === "Left") {
          errors.push(`${name}: ${fetched.left}`)
          walk.done = true
          continue
        }
        const page: Page = fetched.right
        pages++
        // The result limit is hard: records past it on the last page are not recorded.
        const room = Math.max(0, limits.maxResults - results - malformed)
        const records = dedupe(page.records.slice(0, room))
        const bad = page.malformed.slice(0, Math.max(0, room - records.length))
        for (const m of bad) yield* line("malformed_record", "warning", { source, listing: name, identity: m.identity, reason: m.reason })
        malformed += bad.length
        results += records.length
        let known = 0
        if (records.length > 0) {
          const batch: Array<Target.Observation> = records.map((r) => ({ source, identity: r.identity, remoteAt: r.remoteAt }))
          const recorded = yield* store.recordObservations(batch, now)
          for (const id of recorded.inserted) inserted.add(id)
          known = recorded.known
        }
        if (page.truncated === true || page.records.length + page.malformed.length > room) {
          limit = "result_limit"
          break rounds
        }
        const step = Discovery.nextStep(
          {
            pagesFetched: pages,
            resultsSeen: results + malformed,
            pageAllKnown: records.length > 0 && known === records.length,
            hasNext: page.next !== null,
            updatedRescans: policy.updatedRescans
          },
          limits
        )
        if (step._tag === "continue") {
          if (walk.followed.has(page.next!)) {
            errors.push(`${name}: malformed_page: the next-page link leads back to a page this cycle already read (${page.next})`)
            walk.done = true
            continue
          }
          walk.followed.add(page.next!)
          walk.cursor = page.next
          continue
        }
        // The end of one listing (or a known page in it) ends that listing; the hard limits end the cycle.
        if (step.reason === "end_of_listing" || step.reason === "known_page") {
          stopReason = step.reason
          walk.done = true
          continue
        }
        limit = step.reason
        break rounds
      }
    }
    if (errors.length > 0) {
      stopReason = "error"
      const all = errors.join("; ")
      error = all.length > maxErrorLength ? `${all.slice(0, maxErrorLength - 1)}…` : all
    } else if (limit !== null) stopReason = limit

    const promoteEnabled = policy.updatedRescans && Source.hasRemoteTimestamp(source)
    const promoted = promoteEnabled
      ? yield* (settings.promote ?? store.promote)(source, { budget: policy.promotionBudget, cooldownMs: policy.cooldownSeconds * 1000 }, now)
      : { promoted: [], deferred: 0 }
    const { queuedNewCount, queuedUpdatedCount } = Discovery.counts(inserted, new Set(promoted.promoted))
    const clockEnd = yield* Clock.currentTimeMillis
    const cycle = yield* store.recordCycle({
      source,
      startedAt: now,
      endedAt: now + Math.max(0, clockEnd - clockStart),
      pages,
      results,
      malformed,
      queuedNewCount,
      queuedUpdatedCount,
      deferredCount: promoted.deferred,
      stopReason,
      error
    })
    const { time: _t, level: _l, message: _m, ...fields }: LogLine = {
      time: "",
      level: cycle.error === null ? "info" : "warning",
      message: "discovery_cycle",
      source,
      cycleId: cycle.id,
      startedAt: new Date(cycle.startedAt).toISOString(),
      endedAt: new Date(cycle.endedAt).toISOString(),
      pages: cycle.pages,
      results: cycle.results,
      malformed: cycle.malformed,
      queued_new_count: cycle.queuedNewCount,
      queued_updated_count: cycle.queuedUpdatedCount,
      deferred: cycle.deferredCount,
      stop_reason: cycle.stopReason,
      error: cycle.error
    }
    yield* line("discovery_cycle", cycle.error === null ? "info" : "warning", fields)
    return cycle
  })
