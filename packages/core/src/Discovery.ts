import type { Source } from "./Source.js"

/** Hard bounds of one source's discovery cycle. */
export interface Limits {
  readonly maxPages: number
  readonly maxResults: number
}

/** Why a cycle stopped listing. */
export type StopReason = "end_of_listing" | "page_limit" | "result_limit" | "known_page" | "error"

/** What the cycle knows after fetching a page. */
export interface PageState {
  readonly pagesFetched: number
  readonly resultsSeen: number
  /** True when every identity on the page was already known. */
  readonly pageAllKnown: boolean
  readonly hasNext: boolean
  readonly updatedRescans: boolean
}

/**
 * Whether to fetch another page. With updated rescans enabled a page of only
 * known identities never stops discovery (a changed target may be further on);
 * the hard page and result limits always do.
 */
export const nextStep = (s: PageState, limits: Limits): { readonly _tag: "continue" } | { readonly _tag: "stop"; readonly reason: StopReason } => {
  if (!s.hasNext) return { _tag: "stop", reason: "end_of_listing" }
  if (s.pagesFetched >= limits.maxPages) return { _tag: "stop", reason: "page_limit" }
  if (s.resultsSeen >= limits.maxResults) return { _tag: "stop", reason: "result_limit" }
  if (!s.updatedRescans && s.pageAllKnown) return { _tag: "stop", reason: "known_page" }
  return { _tag: "continue" }
}

/** The durable record of one discovery cycle. */
export interface Cycle {
  readonly id: number
  readonly source: Source
  readonly startedAt: number
  readonly endedAt: number
  readonly pages: number
  readonly results: number
  readonly malformed: number
  /** New identities admitted as pending. */
  readonly queuedNewCount: number
  /** Completed targets promoted back to pending because they changed. */
  readonly queuedUpdatedCount: number
  /** Eligible changed targets left for later cycles by the budget. */
  readonly deferredCount: number
  readonly stopReason: StopReason
  readonly error: string | null
}

/** A cycle record before the store gives it an id. */
export type CycleInput = Omit<Cycle, "id">

/**
 * Builds the cycle counts. A target is counted new only when this cycle
 * inserted it and updated only when it was promoted from completed, which a
 * target inserted in the same cycle (pending) can never be: the two never overlap.
 */
export const counts = (inserted: ReadonlySet<string>, promoted: ReadonlySet<string>): { readonly queuedNewCount: number; readonly queuedUpdatedCount: number } => {
  let updated = 0
  for (const id of promoted) if (!inserted.has(id)) updated++
  return { queuedNewCount: inserted.size, queuedUpdatedCount: updated }
}
