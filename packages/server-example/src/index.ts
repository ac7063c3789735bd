/** @scanfleet/server-example */
export {}
export * as Scheduler from "./Scheduler.js"
