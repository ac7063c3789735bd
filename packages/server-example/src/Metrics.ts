import { Migrator } from "@scanfleet/adapters"
import { Assignment, Store, type Source, WorkerWrite } from "@scanfleet/core"
import { Context, Effect, Layer, Runtime } from "effect"
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from "prom-client"
import pkg from "../package.json" with { type: "json" }

/** Bucket bounds of the duration histograms, seconds: one second to a day, roughly doubling. */
export const durationBuckets = [1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14_400, 28_800, 86_400]

/** Bucket bounds of the HTTP request histogram, seconds. */
export const httpBuckets = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]

/** The `route` label of a request no route matched: one value, whatever the path, so a client cannot add series. */
export const unmatched = "unmatched"

/**
 * The server's Prometheus metrics. Counters count what passed through this
 * process's store (progress, expiries, admissions, promotions); gauges read
 * the shared store at scrape time, so every instance reports the same fleet.
 */
export class Metrics extends Context.Tag("@scanfleet/server-example/Metrics")<
  Metrics,
  {
    /** The prom-client registry of this server instance. */
    readonly registry: Registry
    /** The exposition text, `text/plain; version=0.0.4`. */
    readonly text: Effect.Effect<string>
    /** The content type of `text`. */
    readonly contentType: string
    /** Counts one HTTP request and observes its duration, under the route it matched (its template, as `/v1/assignments/:id/result`) or `unmatched`. */
    readonly observeRequest: (method: string, route: string, status: number, seconds: number) => void
  }
>() {}

/** Builds the registry over a store and returns the store wrapped so its writes are counted. */
export const make = (store: Store.StoreShape): Effect.Effect<{ readonly service: Context.Tag.Service<Metrics>; readonly store: Store.StoreShape }> =>
  Effect.gen(function* () {
    const runtime = yield* Effect.runtime<never>()
    const run = Runtime.runPromise(runtime)
    const registry = new Registry()
    registry.setDefaultLabels({})
    collectDefaultMetrics({ register: registry })
    new Gauge({
      name: "scanfleet_build_info",
      help: "Always 1; the labels name this build: the server package version, the newest schema migration it knows and the Node version.",
      labelNames: ["version", "schema", "node"] as const,
      registers: [registry]
    }).set({ version: pkg.version, schema: String(Migrator.latest), node: process.version }, 1)
    const httpRequests = new Counter({
      name: "scanfleet_http_requests_total",
      help: "HTTP requests answered by this instance, by method, route (numeric ids as :id) and status.",
      labelNames: ["method", "route", "status"] as const,
      registers: [registry]
    })
    const httpSeconds = new Histogram({
      name: "scanfleet_http_request_duration_seconds",
      help: "Time to answer an HTTP request, seconds, by method and route.",
      labelNames: ["method", "route"] as const,
      buckets: httpBuckets,
      registers: [registry]
    })
    const durations = new Histogram({
      name: "scanfleet_assignment_duration_seconds",
      help: "Durations of assignments whose result this instance accepted, seconds, per source, metric (end_to_end, scanning, cleanup, bundling, upload; phases only when they completed) and outcome.",
      labelNames: ["source", "metric", "outcome"] as const,
      buckets: durationBuckets,
      registers: [registry]
    })
    // The durations the store recorded for an accepted result, computed by the same core rule from its timeline.
    const observeDurations = (a: Assignment.Assignment, outcome: Assignment.Outcome, acceptedAt: number) =>
      Effect.map(store.timeline(a.reservationId).pipe(Effect.orElseSucceed(() => [])), (evs) => {
        const uploading = evs.find((e) => e.kind === "phase" && e.phase === "uploading")
        for (const d of Assignment.durationsOf(a, evs, outcome, acceptedAt, uploading ? uploading.acceptedAt : null))
          durations.observe({ source: d.source, metric: d.metric, outcome: d.outcome }, d.ms / 1000)
      })

    new Gauge({
      name: "scanfleet_targets",
      help: "Targets by source and status.",
      labelNames: ["source", "status"] as const,
      registers: [registry],
      async collect() {
        const rows = await run(store.countTargets().pipe(Effect.orElseSucceed(() => [])))
        this.reset()
        for (const r of rows) this.set({ source: r.source, status: r.status }, r.count)
      }
    })
    new Gauge({
      name: "scanfleet_active_assignments",
      help: "Active assignments by their last accepted phase (none before the first progress event).",
      labelNames: ["source", "phase"] as const,
      registers: [registry],
      async collect() {
        const rows = await run(store.countAssignments().pipe(Effect.orElseSucceed(() => [])))
        this.reset()
        for (const r of rows) if (r.state === "active") this.inc({ source: r.source, phase: r.lastPhase ?? "none" }, r.count)
      }
    })
    new Gauge({
      name: "scanfleet_discovery_queued_targets",
      help: "Targets queued by every recorded discovery cycle of any instance, per source and kind (new admissions, updated promotions).",
      labelNames: ["source", "kind"] as const,
      registers: [registry],
      async collect() {
        const totals = await run(store.cycleTotals().pipe(Effect.orElseSucceed(() => [])))
        this.reset()
        for (const t of totals) {
          this.set({ source: t.source, kind: "new" }, t.queuedNewCount)
          this.set({ source: t.source, kind: "updated" }, t.queuedUpdatedCount)
        }
      }
    })
    const admissions = new Counter({ name: "scanfleet_new_admissions_total", help: "New targets admitted as pending, per source.", labelNames: ["source"] as const, registers: [registry] })
    const promotions = new Counter({ name: "scanfleet_promotions_total", help: "Completed targets promoted back to pending because they changed, per source.", labelNames: ["source"] as const, registers: [registry] })
    const expiries = new Counter({ name: "scanfleet_expiries_total", help: "Reservations expired by the sweeper, per source.", labelNames: ["source"] as const, registers: [registry] })
    const progress = new Counter({ name: "scanfleet_progress_events_total", help: "Progress events received, by acceptance status (accepted or duplicate).", labelNames: ["status"] as const, registers: [registry] })
    const claims = new Counter({ name: "scanfleet_claims_total", help: "Assignments issued, per source.", labelNames: ["source"] as const, registers: [registry] })
    const results = new Counter({ name: "scanfleet_results_total", help: "Results accepted, per source and outcome.", labelNames: ["source", "outcome"] as const, registers: [registry] })
    // Prometheus convention: a counter is visible at 0 before its first increment.
    progress.inc({ status: "accepted" }, 0)
    progress.inc({ status: "duplicate" }, 0)

    const resultCounted = (input: Store.ResultInput, receipt: Assignment.Receipt) =>
      Effect.flatMap(store.getAssignment(input.reservationId).pipe(Effect.option), (a) =>
        Effect.sync(() => {
          if (a._tag === "Some" && !WorkerWrite.isRepeat(receipt)) results.inc({ source: a.value.source, outcome: receipt.outcome })
        }).pipe(Effect.zipRight(a._tag === "Some" && !WorkerWrite.isRepeat(receipt) ? observeDurations(a.value, receipt.outcome, receipt.acceptedAt) : Effect.void))
      )

    const instrumented: Store.StoreShape = {
      ...store,
      recordObservations: (batch, now) =>
        Effect.tap(store.recordObservations(batch, now), (r) =>
          Effect.sync(() => {
            const inserted = new Set(r.inserted)
            const seen = new Set<string>()
            for (const o of batch)
              if (inserted.has(o.identity) && !seen.has(`${o.source}\u0000${o.identity}`)) {
                seen.add(`${o.source}\u0000${o.identity}`)
                admissions.inc({ source: o.source })
              }
          })
        ),
      promote: (source: Source.Source, rule, now) =>
        Effect.tap(store.promote(source, rule, now), (r) => Effect.sync(() => r.promoted.length > 0 && promotions.inc({ source }, r.promoted.length))),
      claim: (req) => Effect.tap(store.claim(req), (a) => Effect.sync(() => a && claims.inc({ source: a.source }))),
      claimMany: (req) => Effect.tap(store.claimMany(req), (as) => Effect.sync(() => as.forEach((a) => claims.inc({ source: a.source })))),
      appendProgress: (auth, events) =>
        Effect.tap(store.appendProgress(auth, events), (r) =>
          Effect.sync(() => {
            for (const x of r.results) progress.inc({ status: x.status })
          })
        ),
      submitResult: (input) => Effect.tap(store.submitResult(input), (receipt) => resultCounted(input, receipt)),
      submitResultAndClaim: (input, next) =>
        Effect.tap(store.submitResultAndClaim(input, next), (r) =>
          Effect.zipRight(
            resultCounted(input, r.receipt),
            Effect.sync(() => r.next && claims.inc({ source: r.next.source }))
          )
        ),
      submitResults: (inputs) =>
        Effect.tap(store.submitResults(inputs), (answers) =>
          Effect.forEach(answers, (r, i) =>
            r._tag === "Right" && !WorkerWrite.isRepeat(r.right)
              ? Effect.flatMap(store.getAssignment(r.right.reservationId).pipe(Effect.option), (a) =>
                  Effect.sync(() => a._tag === "Some" && results.inc({ source: a.value.source, outcome: r.right.outcome })).pipe(
                    Effect.zipRight(a._tag === "Some" ? observeDurations(a.value, r.right.outcome, r.right.acceptedAt) : Effect.void)
                  )
                )
              : Effect.void
          )
        ),
      expireDue: (req) =>
        Effect.tap(store.expireDue(req), (expired) =>
          Effect.sync(() => {
            for (const a of expired) expiries.inc({ source: a.source })
          })
        )
    }

    const service: Context.Tag.Service<Metrics> = {
      registry,
      contentType: registry.contentType,
      text: Effect.promise(() => registry.metrics()),
      observeRequest: (method, route, status, seconds) => {
        httpRequests.inc({ method, route, status: String(status) })
        httpSeconds.observe({ method, route }, seconds)
      }
    }
    return { service, store: instrumented }
  })

/**
 * A layer that replaces the Store in context with its instrumented wrapper
 * and provides the Metrics service.
 */
export const layer: Layer.Layer<Metrics | Store.Store, never, Store.Store> = Layer.effectContext(
  Effect.gen(function* () {
    const store = yield* Store.Store
    const m = yield* make(store)
    return Context.make(Metrics, m.service).pipe(Context.add(Store.Store, m.store))
  })
)
