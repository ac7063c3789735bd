import { Either } from "effect"
import { ClaimRejected, type SlotHolder } from "./Errors.js"
import type { Target } from "./Target.js"

/**
 * Takes authority over a pending target: `coveredRemoteAt` becomes the newest
 * observation as it is at this instant, the fence is bumped, the scan start is
 * stamped. A rejected claim returns the reason and changes nothing.
 */
export const claim = (t: Target, expectedFence: number, now: number): Either.Either<Target, ClaimRejected> => {
  if (t.status !== "pending") return Either.left(new ClaimRejected({ reason: "not_pending", message: `target ${t.id} is ${t.status}` }))
  if (t.fence !== expectedFence)
    return Either.left(new ClaimRejected({ reason: "fence", message: `target ${t.id} fence moved to ${t.fence}` }))
  return Either.right({
    ...t,
    status: "in_progress",
    coveredRemoteAt: t.observedRemoteAt,
    fence: t.fence + 1,
    lastScanStartedAt: now,
    attempts: t.attempts + 1
  })
}

/** A slot of a device and the active reservation that holds it. */
export interface Held extends SlotHolder {
  readonly slot: number
}

/**
 * Why a device of `deviceSlots` slots whose `busy` slots hold active reservations cannot take the
 * `requested` ones, checked slot by slot in order as successive single claims would be: a slot out
 * of range (`capacity`), a slot busy (`slot_busy`, naming its reservation) or listed twice
 * (`slot_busy`), a device already full (`capacity`). `undefined` when every requested slot can be
 * filled.
 */
export const refuseSlots = (deviceSlots: number, busy: ReadonlyArray<Held>, requested: ReadonlyArray<number>): ClaimRejected | undefined => {
  const holders = new Map(busy.map((h) => [h.slot, h]))
  const held = new Set(holders.keys())
  let count = busy.length
  for (const slot of requested) {
    if (!Number.isInteger(slot) || slot < 0 || slot >= deviceSlots)
      return new ClaimRejected({ reason: "capacity", message: `slot ${slot} is outside the device's ${deviceSlots} slots` })
    const holder = holders.get(slot)
    if (holder !== undefined)
      return new ClaimRejected({
        reason: "slot_busy",
        message: `slot ${slot} already holds a reservation (${holder.reservationId}, fence ${holder.fence})`,
        holder: { reservationId: holder.reservationId, fence: holder.fence }
      })
    if (held.has(slot)) return new ClaimRejected({ reason: "slot_busy", message: `slot ${slot} is listed twice in one claim` })
    if (count >= deviceSlots) return new ClaimRejected({ reason: "capacity", message: `device holds ${count} of ${deviceSlots} slots` })
    held.add(slot)
    count++
  }
  return undefined
}

/**
 * A claim that would commit at `now` after its client's deadline `notAfter`:
 * the refusal, else `undefined` (also when there is no deadline).
 */
export const pastDeadline = (notAfter: number | undefined, now: number): ClaimRejected | undefined =>
  notAfter !== undefined && now > notAfter ? deadlinePassed(notAfter) : undefined

/** The refusal of a claim whose client gave up at `notAfter`. */
export const deadlinePassed = (notAfter: number): ClaimRejected =>
  new ClaimRejected({ reason: "deadline_passed", message: `the client stopped waiting at ${new Date(notAfter).toISOString()}; nothing was claimed` })

/** True when a write made under `fence` still holds authority over the target. */
export const holds = (t: Target, fence: number): boolean => t.status === "in_progress" && t.fence === fence

/**
 * Completes a scan. `observedRemoteAt` is kept as it is: an update recorded
 * during the scan stays newer than the covered snapshot, so exactly one
 * follow-up becomes eligible once the cooldown has elapsed.
 */
export const complete = (t: Target, now: number): Target => ({ ...t, status: "completed", completedAt: now })

/** Ends a scan as failed; the target waits for its source's failure backoff or a newer revision (`Retry`). */
export const fail = (t: Target, status: "failed" | "unresolved" = "failed"): Target => ({ ...t, status })

/** Gives a claimed target back to the queue (an authority change: fence bumped). */
export const release = (t: Target): Target => ({ ...t, status: "pending", fence: t.fence + 1 })

/** Expires a claimed target: back to pending while attempts at this revision remain (`Retry`), else failed. */
export const expire = (t: Target, maxAttempts: number): Target => ({
  ...t,
  status: t.attempts < maxAttempts ? "pending" : "failed",
  fence: t.fence + 1
})
