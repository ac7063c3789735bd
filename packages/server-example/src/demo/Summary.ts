import type { WorkerApi } from "@scanfleet/core"
import type { z } from "zod"

/** The dashboard's headline numbers, as `GET /v1/admin/summary` returns them. */
export type Numbers = z.infer<typeof WorkerApi.SummaryView>

/** Discovery cycles that failed, per source (from the recorded cycles), and the newest failure. */
export interface SourceErrors {
  readonly bySource: Readonly<Record<string, number>>
  readonly last: { readonly at: number; readonly text: string } | null
}

/** What went wrong lately: the source errors and the last error-level log line (either may be absent). */
export interface Problems {
  readonly sources?: SourceErrors
  readonly lastErrorLine?: { readonly at: number; readonly text: string } | null
}

const clock = (at: number) => new Date(at).toISOString().slice(11, 19)
const newest = (p: Problems) => {
  const a = p.sources?.last ?? null
  const b = p.lastErrorLine ?? null
  return a === null ? b : b === null ? a : a.at >= b.at ? a : b
}
const oneLine = (t: string, max = 160) => {
  const l = t.replace(/\s+/g, " ").trim()
  return l.length > max ? `${l.slice(0, max - 1)}…` : l
}

/** The summary lines, the same numbers and names as the dashboard's summary block, then the errors. */
export const lines = (s: Numbers, at: number, p: Problems = {}): ReadonlyArray<string> => {
  const last = newest(p)
  return [
    `scanfleet demo at ${clock(at)} UTC`,
    `  targets    queued new ${s.targets.queuedNew}   queued updated ${s.targets.queuedUpdated}   pending ${s.targets.pending}   in progress ${s.targets.inProgress}`,
    `  assignments running ${s.assignments.running}   completed ${s.assignments.completed}   timed out ${s.assignments.timedOut}   failed ${s.assignments.failed}   expired ${s.assignments.expired}`,
    ...(p.sources ? [`  source errors ${Object.entries(p.sources.bySource).map(([k, n]) => `${k} ${n}`).join("   ")}`] : []),
    `  last error ${last ? `${clock(last.at)} ${oneLine(last.text)}` : "none"}`
  ]
}

/** One plain line with the same numbers, for a log or a pipe. */
export const plain = (s: Numbers, at: number, p: Problems = {}): string => {
  const last = newest(p)
  return (
    `${new Date(at).toISOString()} queued_new=${s.targets.queuedNew} queued_updated=${s.targets.queuedUpdated} pending=${s.targets.pending} ` +
    `running=${s.assignments.running} completed=${s.assignments.completed} timed_out=${s.assignments.timedOut} failed=${s.assignments.failed} expired=${s.assignments.expired}` +
    (p.sources ? ` source_errors=${Object.values(p.sources.bySource).reduce((a, n) => a + n, 0)}` : "") +
    (last ? ` last_error=${JSON.stringify(oneLine(last.text))}` : "")
  )
}

/**
 * A summary that redraws itself in place on a terminal (one block, moved over
 * with ANSI cursor-up and erase-line), and prints a plain line only when the
 * numbers change when the output is a pipe or a file.
 */
export const printer = (out: { readonly isTTY?: boolean; write(s: string): unknown }) => {
  let drawn = 0
  let lastPlain = ""
  return {
    show: (s: Numbers, at: number, p: Problems = {}) => {
      if (out.isTTY) {
        const ls = lines(s, at, p)
        // Cursor up over the previous block, then rewrite each line and clear its rest.
        out.write((drawn > 0 ? `\x1b[${drawn}A` : "") + ls.map((l) => `\r${l}\x1b[K\n`).join(""))
        drawn = ls.length
        return
      }
      const key = plain(s, 0, p).slice(plain(s, 0, p).indexOf(" ") + 1)
      if (key === lastPlain) return
      lastPlain = key
      out.write(`${plain(s, at, p)}\n`)
    },
    /** Writes text above the block; the block is redrawn below it on the next `show`. */
    note: (text: string) => {
      if (out.isTTY && drawn > 0) {
        out.write(`\x1b[${drawn}A\r\x1b[J`)
        drawn = 0
      }
      out.write(`${text}\n`)
    }
  }
}
