import { WorkerApi } from "@scanfleet/core"
import { closeSync, openSync, writeSync } from "node:fs"
import type * as Scanner from "../Scanner.js"
import type { OutputLimits } from "../UnitProtocol.js"

/**
 * A scanner's stdout as the unit takes it in: written as it comes to a file
 * in the work folder (up to its limit), split into lines without ever
 * holding more than one line's limit, and parsed into findings until the
 * count or byte limit is reached. Past the limits it only counts, so memory
 * stays flat however much a scanner prints.
 */
export interface Collector {
  /** Takes one chunk of stdout. */
  readonly write: (chunk: Buffer) => void
  /** Takes a finding produced another way (a runner module). */
  readonly offer: (finding: Record<string, unknown>) => void
  /** Ends the stream (a last line without a newline counts) and closes the file. */
  readonly end: () => void
  readonly findings: () => ReadonlyArray<Record<string, unknown>>
  readonly malformed: () => number
  /** What was cut so far (log characters are the log's business: 0 here). */
  readonly cut: () => Scanner.Cut
}

const NL = 0x0a

/**
 * Whether a parsed line nests deeper than a finding may: it sits at level 3 of a result body,
 * which nests at most `WorkerApi.maxJsonDepth` levels. Walked without recursion, so a line
 * nested 100,000 deep is measured, not a stack overflow in whatever reads it next.
 */
const tooDeep = (value: unknown): boolean => {
  const stack: Array<[unknown, number]> = [[value, 3]]
  while (stack.length > 0) {
    const [v, level] = stack.pop()!
    if (typeof v !== "object" || v === null) continue
    if (level > WorkerApi.maxJsonDepth) return true
    for (const child of Array.isArray(v) ? v : Object.values(v)) stack.push([child, level + 1])
  }
  return false
}

/** Makes a collector writing to `file` (null: no file). */
export const collector = (limits: OutputLimits, file: string | null): Collector => {
  const fd = file === null ? null : openSync(file, "w")
  const kept: Array<Record<string, unknown>> = []
  let keptBytes = 0
  let cutFindings = 0
  let malformed = 0
  let longLines = 0
  let stdoutBytes = 0
  let stored = 0
  // The current line: its parts so far, unless it grew past the line limit.
  let parts: Array<Buffer> = []
  let partBytes = 0
  let overlong = false

  const full = () => kept.length >= limits.maxFindings || keptBytes >= limits.maxFindingsBytes

  const offer = (finding: Record<string, unknown>, bytes?: number) => {
    const size = bytes ?? Buffer.byteLength(JSON.stringify(finding))
    if (kept.length >= limits.maxFindings || keptBytes + size > limits.maxFindingsBytes) {
      cutFindings++
      return
    }
    kept.push(finding)
    keptBytes += size
  }

  const line = (buf: Buffer) => {
    // Only a line that opens with "{" can be a finding: plain text is counted as such without a parse.
    let i = 0
    while (i < buf.length && (buf[i] === 0x20 || buf[i] === 0x09 || buf[i] === 0x0d)) i++
    if (i === buf.length) return
    if (buf[i] !== 0x7b) {
      malformed++
      return
    }
    if (full()) {
      // Past the limits a line is counted as a finding cut, not parsed: parsing it would change nothing.
      cutFindings++
      return
    }
    try {
      const v: unknown = JSON.parse(buf.toString("utf8"))
      if (v !== null && typeof v === "object" && !Array.isArray(v) && !tooDeep(v)) offer(v as Record<string, unknown>, buf.length)
      else malformed++
    } catch {
      malformed++
    }
  }

  const endLine = () => {
    if (overlong) longLines++
    else if (parts.length > 0) line(parts.length === 1 ? parts[0] : Buffer.concat(parts, partBytes))
    parts = []
    partBytes = 0
    overlong = false
  }

  const take = (piece: Buffer) => {
    if (overlong || piece.length === 0) return
    if (partBytes + piece.length > limits.maxLineBytes) {
      overlong = true
      parts = []
      partBytes = 0
      return
    }
    // A copy: the chunk's memory is not kept alive by a slice of it.
    parts.push(Buffer.from(piece))
    partBytes += piece.length
  }

  return {
    write: (chunk) => {
      stdoutBytes += chunk.length
      if (fd !== null && stored < limits.maxStdoutFileBytes) {
        const n = Math.min(chunk.length, limits.maxStdoutFileBytes - stored)
        writeSync(fd, chunk, 0, n)
        stored += n
      }
      let start = 0
      for (let nl = chunk.indexOf(NL, start); nl >= 0; nl = chunk.indexOf(NL, start)) {
        take(chunk.subarray(start, nl))
        endLine()
        start = nl + 1
      }
      take(chunk.subarray(start))
    },
    offer: (f) => offer(f),
    end: () => {
      endLine()
      if (fd !== null) closeSync(fd)
    },
    findings: () => kept,
    malformed: () => malformed,
    cut: () => ({ findings: cutFindings, longLines, stdoutBytes, unstoredBytes: stdoutBytes - stored, logChars: 0 })
  }
}

/** A log that keeps its tail within a character limit and says how much it dropped. */
export interface Log {
  readonly append: (text: string) => void
  /** The tail, with `notes` after it; the whole within the limit. */
  readonly text: (notes: string) => string
  readonly dropped: () => number
}

/** Makes a bounded log. */
export const log = (maxChars: number): Log => {
  let buf = ""
  let dropped = 0
  return {
    append: (t) => {
      buf += t
      // Trimmed in steps, not on every append, so a chatty scanner costs linear time.
      if (buf.length > maxChars * 2) {
        dropped += buf.length - maxChars
        buf = buf.slice(buf.length - maxChars)
      }
    },
    text: (notes) => {
      const room = Math.max(0, maxChars - notes.length)
      const cut = Math.max(0, buf.length - room)
      dropped += cut
      buf = buf.slice(cut)
      return buf + notes
    },
    dropped: () => dropped
  }
}

/** Says what was cut, in words, for the end of the log. */
export const describeCut = (cut: Scanner.Cut, limits: OutputLimits, malformed: number): string => {
  const notes: Array<string> = []
  if (cut.findings > 0)
    notes.push(`${cut.findings} finding(s) cut at the limits (${limits.maxFindings} findings, ${limits.maxFindingsBytes} bytes of findings)`)
  if (cut.longLines > 0) notes.push(`${cut.longLines} stdout line(s) longer than ${limits.maxLineBytes} bytes dropped unread`)
  if (malformed > 0) notes.push(`${malformed} stdout line(s) were not JSON objects (or nested deeper than ${WorkerApi.maxJsonDepth - 2} levels) and were dropped`)
  if (cut.unstoredBytes > 0) notes.push(`stdout was ${cut.stdoutBytes} bytes; ${cut.unstoredBytes} beyond the ${limits.maxStdoutFileBytes}-byte stdout file were counted, not stored`)
  return notes.map((n) => `\n[${n}]`).join("")
}
