/** @scanfleet/server-example */
export {}
