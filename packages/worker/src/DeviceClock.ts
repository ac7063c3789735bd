import { Clock, Effect, Either } from "effect"
import { readFileSync, renameSync, writeFileSync } from "node:fs"
import { z } from "zod"
import * as Damage from "./internal/Damage.js"

/**
 * The one clock a device compares deadlines with: epoch milliseconds that a
 * wall-clock step (NTP, an operator's `date -s`) cannot move. It is an anchor
 * (wall clock minus the monotonic clock, taken once per boot) plus the
 * system-wide monotonic clock, which every process shares since boot. The
 * anchor is kept beside the state file under the kernel's boot id, so the
 * controller, its execution units and a restarted controller read the same
 * time; a new boot (or a system without a boot id) takes a fresh anchor.
 * An anchor file that holds something else (cut short, overwritten) is set
 * aside, said, and replaced by a fresh anchor. Log lines keep the wall clock.
 */

/** The system-wide monotonic clock (CLOCK_MONOTONIC), milliseconds since boot: never stepped, the same in every process. */
export const monotonicMs = (): number => Number(process.hrtime.bigint()) / 1e6

/** A device clock. */
export interface DeviceClock {
  /** Wall clock minus monotonic clock when the anchor was taken, milliseconds. */
  readonly anchorMs: number
  /** Now on the device clock, epoch milliseconds (an integer). */
  readonly now: () => number
  /** A device-clock time as the wall clock reads it at this moment (for labels a person reads). */
  readonly toWall: (at: number) => number
}

/** The device clock of an anchor. */
export const fromAnchor = (anchorMs: number): DeviceClock => {
  const now = () => Math.floor(anchorMs + monotonicMs())
  return { anchorMs, now, toWall: (at) => at + Date.now() - now() }
}

/** A clock anchored at this moment. */
export const fresh = (): DeviceClock => fromAnchor(Date.now() - monotonicMs())

/** This process's clock when nobody passes one (anchored when the module loads). */
export const processClock: DeviceClock = fresh()

const bootId = (): string | null => {
  try {
    return readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim() || null
  } catch {
    return null
  }
}

const anchorFile = (state: string) => `${state}.clock`

// Fields a later build may add are kept out of the way, not taken for damage.
const AnchorSchema = z.object({ bootId: z.string(), anchorMs: z.number().finite() })

/** What the anchor file says: an anchor for some boot, none (no file, or one that cannot be read), or what is wrong with what it holds. */
const saved = (state: string): Either.Either<z.infer<typeof AnchorSchema> | null, string> => {
  let text: string
  try {
    text = readFileSync(anchorFile(state), "utf8")
  } catch {
    // Missing, or unreadable (its writer fails the start at the state file if the folder is): a fresh anchor serves.
    return Either.right(null)
  }
  return Damage.decode(AnchorSchema, text)
}

/** An anchor file that held something else than an anchor, set aside for a fresh one. */
export interface DamagedAnchor {
  readonly file: string
  readonly setAsideAs: string
  /** What was wrong with it. */
  readonly problem: string
}

/**
 * The device clock of a state file: the anchor kept beside it for this boot,
 * or a fresh one, saved there for the units and later controllers of this boot.
 * A damaged anchor file is set aside first, and `onDamaged` told (call it under
 * the state file's lock: nothing else may move the file meanwhile).
 *
 * @example
 * const clock = DeviceClock.forState("./worker.db")
 * clock.now() >= assignment.deadlines.scan
 */
export const forState = (state: string, onDamaged: (d: DamagedAnchor) => void = () => {}): DeviceClock => {
  const kept = saved(state)
  if (Either.isLeft(kept)) onDamaged({ file: anchorFile(state), setAsideAs: Damage.setAside(anchorFile(state), new Date()), problem: kept.left })
  const boot = bootId()
  if (boot === null) return fresh()
  const anchor = Either.getOrNull(kept)
  if (anchor !== null && anchor.bootId === boot) return fromAnchor(anchor.anchorMs)
  const clock = fresh()
  try {
    const tmp = `${anchorFile(state)}.${process.pid}.tmp`
    writeFileSync(tmp, JSON.stringify({ bootId: boot, anchorMs: clock.anchorMs }))
    renameSync(tmp, anchorFile(state))
  } catch {
    // An unwritable state dir fails the start at the state file; this process's anchor serves until then.
  }
  return clock
}

/** The device clock of a state file for a reader (`status`, `history`): the kept anchor of this boot, else the wall clock. */
export const readState = (state: string): DeviceClock => {
  const anchor = Either.getOrNull(saved(state))
  return anchor !== null && anchor.bootId === bootId() ? fromAnchor(anchor.anchorMs) : fresh()
}

/** The device clock as Effect's `Clock` (sleeps are the default clock's timers, which are monotonic). */
export const effectClock = (clock: DeviceClock): Clock.Clock => {
  const base = Clock.make()
  return {
    [Clock.ClockTypeId]: Clock.ClockTypeId,
    unsafeCurrentTimeMillis: clock.now,
    currentTimeMillis: Effect.sync(clock.now),
    unsafeCurrentTimeNanos: () => BigInt(clock.now()) * 1_000_000n,
    currentTimeNanos: Effect.sync(() => BigInt(clock.now()) * 1_000_000n),
    sleep: (d) => base.sleep(d)
  }
}
