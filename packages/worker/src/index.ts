/** @scanfleet/worker */
export {}
