import { Findings, FindingStore, FindingsApi } from "@scanfleet/core"
import { Effect } from "effect"
import * as Database from "./Database.js"
import type * as ServerConfig from "./ServerConfig.js"
import type { z } from "zod"

/** A findings command line that cannot be run as given. */
export class FindingsUsageError extends Error {}

const pick = (flags: ReadonlyMap<string, string>, names: ReadonlyArray<string>) => Object.fromEntries(names.filter((n) => flags.has(n)).map((n) => [n, flags.get(n)!]))

const parse = <S extends z.ZodType>(schema: S, flags: ReadonlyMap<string, string>, names: ReadonlyArray<string>): z.output<S> => {
  const r = schema.safeParse(pick(flags, names))
  if (!r.success) throw new FindingsUsageError(r.error.issues.map((i) => `--${i.path.join(".")}: ${i.message}`).join("; "))
  return r.data as z.output<S>
}

const filterNames = ["source", "identity", "detector", "status", "verified", "since"]

const withFindings = <A, E>(config: ServerConfig.ServerConfig, f: (fs: FindingStore.FindingStoreShape) => Effect.Effect<A, E>) =>
  Effect.runPromise(Effect.flatMap(FindingStore.FindingStore, f).pipe(Effect.provide(Database.layer(config.databaseUrl, Database.optionsOf(config)))))

const clean = <Q extends object>(q: Q) => Object.fromEntries(Object.entries(q).filter(([k, v]) => v !== undefined && k !== "format")) as Omit<Findings.ListQuery, "limit">

/**
 * Runs `findings <list|target|export>` against the database of `config`,
 * writing to `out` (stdout) and `err` (stderr); returns the exit code.
 */
export const main = async (words: ReadonlyArray<string>, flags: ReadonlyMap<string, string>, config: ServerConfig.ServerConfig, out: (s: string) => void, err: (s: string) => void): Promise<number> => {
  const [cmd, ...rest] = words
  if (cmd === "list" && rest.length === 0) {
    const q = parse(FindingsApi.ListQuery, flags, [...filterNames, "after", "limit"])
    const page = await withFindings(config, (f) => f.list({ ...clean(q), limit: q.limit }))
    out(Findings.toJsonLines(page.findings))
    if (page.next !== null) err(`more: --after ${page.next}`)
    return 0
  }
  if (cmd === "target" && rest.length === 2) {
    const [source, identity] = rest
    const q = FindingsApi.TargetQuery.safeParse({ source, identity })
    if (!q.success) throw new FindingsUsageError(`findings target SOURCE IDENTITY: ${q.error.issues.map((i) => i.message).join("; ")}`)
    // The whole history, read a page of each list at a time (the API answers one page a call).
    const t = await withFindings(config, (f) =>
      Effect.either(
        Effect.gen(function* () {
          const key = { source: q.data.source, identity: q.data.identity, limit: 1000 }
          // A page carries each finding's newest changes; those with older ones are read whole from their history.
          const changes = (p: FindingStore.TargetFindings) =>
            Effect.gen(function* () {
              const events = p.events.filter((e) => !p.moreEvents.includes(e.findingId))
              for (const findingId of p.moreEvents) {
                for (let after: number | null = 0; after !== null; ) {
                  const h: FindingStore.History = yield* f.history({ findingId, after, limit: 1000 })
                  events.push(...h.events)
                  after = h.next
                }
              }
              return events
            })
          const first = yield* f.forTarget(key)
          const all = { findings: [...first.findings], events: yield* changes(first), scans: [...first.scans] }
          for (let after = first.next; after !== null; ) {
            const p: FindingStore.TargetFindings = yield* f.forTarget({ ...key, after })
            all.findings.push(...p.findings)
            all.events.push(...(yield* changes(p)))
            after = p.next
          }
          for (let scansAfter = first.nextScans; scansAfter !== null; ) {
            const p: FindingStore.TargetFindings = yield* f.forTarget({ ...key, scansAfter })
            all.scans.push(...p.scans)
            scansAfter = p.nextScans
          }
          return { ...all, events: all.events.sort(FindingStore.eventOrder) }
        })
      )
    )
    if (t._tag === "Left") {
      err(t.left._tag === "NotFound" ? `no findings and no related scan for ${source}:${identity}` : t.left.message)
      return 1
    }
    out(`${JSON.stringify({ findings: t.right.findings.map(Findings.view), events: t.right.events, scans: t.right.scans }, null, 2)}\n`)
    return 0
  }
  if (cmd === "export" && rest.length === 0) {
    const q = parse(FindingsApi.ExportQuery, flags, [...filterNames, "format"])
    // Every match, with no cap (the API stops at its export limit): JSON lines are written page by
    // page, so memory stays at one page; a SARIF log is one document and is built whole.
    const all: Array<Findings.Finding> = []
    await withFindings(config, (f) =>
      Effect.gen(function* () {
        let after = 0
        for (;;) {
          const page = yield* f.list({ ...clean(q), after, limit: 1000 })
          if (q.format === "sarif") all.push(...page.findings)
          else out(Findings.toJsonLines(page.findings))
          if (page.next === null) return
          after = page.next
        }
      })
    )
    if (q.format === "sarif") out(`${JSON.stringify(Findings.toSarif(all, { name: "scanfleet", version: "2" }))}\n`)
    return 0
  }
  throw new FindingsUsageError(`unknown findings command: findings ${words.join(" ")}`)
}
