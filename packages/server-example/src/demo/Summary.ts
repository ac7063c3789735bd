import type { WorkerApi } from "@scanfleet/core"
import type { z } from "zod"

/** The dashboard's headline numbers, as `GET /v1/admin/summary` returns them. */
export type Numbers = z.infer<typeof WorkerApi.SummaryView>

/** The summary lines, the same numbers and names as the dashboard's summary block. */
export const lines = (s: Numbers, at: number): ReadonlyArray<string> => [
  `scanfleet demo at ${new Date(at).toISOString().slice(11, 19)} UTC`,
  `  targets    queued new ${s.targets.queuedNew}   queued updated ${s.targets.queuedUpdated}   pending ${s.targets.pending}   in progress ${s.targets.inProgress}`,
  `  assignments running ${s.assignments.running}   completed ${s.assignments.completed}   timed out ${s.assignments.timedOut}   failed ${s.assignments.failed}   expired ${s.assignments.expired}`
]

/** One plain line with the same numbers, for a log or a pipe. */
export const plain = (s: Numbers, at: number): string =>
  `${new Date(at).toISOString()} queued_new=${s.targets.queuedNew} queued_updated=${s.targets.queuedUpdated} pending=${s.targets.pending} ` +
  `running=${s.assignments.running} completed=${s.assignments.completed} timed_out=${s.assignments.timedOut} failed=${s.assignments.failed} expired=${s.assignments.expired}`

/**
 * A summary that redraws itself in place on a terminal (one block, moved over
 * with ANSI cursor-up and erase-line), and prints a plain line only when the
 * numbers change when the output is a pipe or a file.
 */
export const printer = (out: { readonly isTTY?: boolean; write(s: string): unknown }) => {
  let drawn = 0
  let lastPlain = ""
  return {
    show: (s: Numbers, at: number) => {
      if (out.isTTY) {
        const ls = lines(s, at)
        // Cursor up over the previous block, then rewrite each line and clear its rest.
        out.write((drawn > 0 ? `\x1b[${drawn}A` : "") + ls.map((l) => `\r${l}\x1b[K\n`).join(""))
        drawn = ls.length
        return
      }
      const key = plain(s, 0).slice(plain(s, 0).indexOf(" ") + 1)
      if (key === lastPlain) return
      lastPlain = key
      out.write(`${plain(s, at)}\n`)
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
