import { Data } from "effect"
import type { Phase } from "./PhaseModel.js"

/** An active reservation that holds a device's slot: the device's own, named so that it can give it back. */
export interface SlotHolder {
  readonly reservationId: number
  readonly fence: number
}

/** A claim that could not take authority; nothing changed. */
export class ClaimRejected extends Data.TaggedError("ClaimRejected")<{
  readonly reason: "capacity" | "slot_busy" | "source_cap" | "unknown_device" | "fence" | "not_pending" | "deadline_passed"
  readonly message: string
  /**
   * With `slot_busy` for a slot an active reservation holds: that reservation. A device whose
   * local state does not know it (the claim's answer was lost, or the state was) releases it
   * instead of idling the slot until its assignment expiry.
   */
  readonly holder?: SlotHolder
}> {}

/** A worker write refused because the reservation is not the caller's live one. */
export class ReservationRefused extends Data.TaggedError("ReservationRefused")<{
  readonly reason: "not_found" | "not_owner" | "stale_fence" | "not_active" | "expired" | "upload_deadline_passed"
  readonly reservationId: number
  readonly message: string
}> {}

/** A progress batch refused as a whole; nothing of it was stored. */
export class ProgressRejected extends Data.TaggedError("ProgressRejected")<{
  readonly reason: "sequence_gap" | "illegal_transition" | "conflict" | "terminal"
  readonly seq: number
  readonly phase?: Phase
  readonly message: string
}> {}

/**
 * A storage failure, mapped from the backend's own error inside the adapter.
 * `unavailable` (unreachable), `full` (out of space or memory) and `conflict`
 * (locked or contended) may pass on retry; `invalid` (a value the database
 * cannot store), `constraint`, `corrupt` and `internal` (a defect) will not.
 */
export class StoreError extends Data.TaggedError("StoreError")<{
  readonly reason: "unavailable" | "full" | "conflict" | "invalid" | "constraint" | "corrupt" | "internal"
  readonly message: string
  readonly cause?: unknown
}> {}

/** A lookup that found nothing. */
export class NotFound extends Data.TaggedError("NotFound")<{
  readonly entity: "target" | "assignment" | "device" | "config" | "finding"
  readonly key: string
}> {}

/** Whether running the same operation again may succeed: only for an unreachable, full or contended store. */
export const isRetriable = (e: StoreError): boolean => e.reason === "unavailable" || e.reason === "full" || e.reason === "conflict"
