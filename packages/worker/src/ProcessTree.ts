import { readdirSync, readFileSync } from "node:fs"
import * as DeviceClock from "./DeviceClock.js"

/**
 * Processes and process groups as /proc shows them, so a live member can be
 * told from a zombie and a recycled pid from the runner that was started
 * (elsewhere it falls back to `kill(-pgid, 0)`). Ending a scan stage is
 * `Containment`'s business: a snapshot of a tree cannot see what forks after it.
 */

/** One process as /proc/<pid>/stat describes it. */
export interface ProcStat {
  readonly pid: number
  readonly ppid: number
  readonly pgid: number
  /** The session id. */
  readonly sid: number
  readonly state: string
  readonly startTime: string
}

const hasProc = (() => {
  try {
    readdirSync("/proc/self")
    return true
  } catch {
    return false
  }
})()

/** Reads one process's stat line; null when it is gone. */
export const stat = (pid: number): ProcStat | null => {
  try {
    const line = readFileSync(`/proc/${pid}/stat`, "utf8")
    // The command name may hold spaces and parentheses: split after the last ')'.
    const rest = line.slice(line.lastIndexOf(")") + 2).split(" ")
    return { pid, state: rest[0], ppid: Number(rest[1]), pgid: Number(rest[2]), sid: Number(rest[3]), startTime: rest[19] }
  } catch {
    return null
  }
}

/** Every process visible in /proc. */
export const all = (): ReadonlyArray<ProcStat> => {
  if (!hasProc) return []
  const out: Array<ProcStat> = []
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue
    const s = stat(Number(name))
    if (s) out.push(s)
  }
  return out
}

/** True while a process exists and is not a zombie. */
export const isAlive = (pid: number): boolean => {
  const s = stat(pid)
  return s !== null && s.state !== "Z" && s.state !== "X"
}

/** The start time of a process (clock ticks since boot), to recognise it after a restart. */
export const startTime = (pid: number): string | null => stat(pid)?.startTime ?? null

/** Live (non-zombie) members of a process group. */
export const members = (pgid: number): ReadonlyArray<number> => {
  // The cheap question first: a group with no member at all answers ESRCH. Only
  // when something is there is /proc read, to tell the living from zombies.
  try {
    process.kill(-pgid, 0)
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ESRCH") return []
  }
  if (hasProc) return all().filter((p) => p.pgid === pgid && p.state !== "Z" && p.state !== "X").map((p) => p.pid)
  return [pgid]
}

/** Sends a signal to a whole group; a group that is already gone is not an error. */
export const signalGroup = (pgid: number, signal: NodeJS.Signals): boolean => {
  try {
    process.kill(-pgid, signal)
    return true
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ESRCH") return false
    throw e
  }
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms))

/** Waits until a group has no live member, up to `ms`; true when it emptied. */
export const waitEmpty = async (pgid: number, ms: number): Promise<boolean> => {
  const until = DeviceClock.monotonicMs() + ms
  for (;;) {
    if (members(pgid).length === 0) return true
    if (DeviceClock.monotonicMs() >= until) return false
    await sleep(10)
  }
}

/**
 * Kills what is left of a runner group from a previous run of the controller,
 * unless its leader's pid now belongs to another process (a recycled pid).
 */
export const killStale = async (runner: { readonly pgid: number; readonly startTime: string | null }): Promise<ReadonlyArray<number>> => {
  const leader = stat(runner.pgid)
  if (leader && runner.startTime !== null && leader.startTime !== runner.startTime && leader.state !== "Z") return []
  const found = members(runner.pgid)
  if (found.length === 0) return []
  signalGroup(runner.pgid, "SIGKILL")
  await waitEmpty(runner.pgid, 1000)
  return found
}
