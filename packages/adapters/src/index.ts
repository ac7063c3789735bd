/** @scanfleet/adapters */
export {}
