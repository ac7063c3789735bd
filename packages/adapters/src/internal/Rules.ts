import { WorkerWrite } from "@scanfleet/core"

// The worker-write rules live in core (WorkerWrite); this module only keeps the names
// the SQL adapter's queries import.

/** core's WorkerWrite.refuse. */
export const refuse = WorkerWrite.refuse
/** core's WorkerWrite.authorize. */
export const authorize = WorkerWrite.authorize
/** core's WorkerWrite.requireLive. */
export const requireLive = WorkerWrite.requireLive
/** core's WorkerWrite.lostTarget. */
export const lostTarget = WorkerWrite.lostTarget
/** core's WorkerWrite.planProgress. */
export const planProgress = WorkerWrite.planProgress
/** core's WorkerWrite.ProgressPlan. */
export type ProgressPlan = WorkerWrite.ProgressPlan
