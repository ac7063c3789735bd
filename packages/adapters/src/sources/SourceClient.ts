import { Data, type Effect } from "effect"
import type { Source } from "@scanfleet/core"

/** One well-formed discovery record: the target identity and its normalised remote time. */
export interface SourceRecord {
  readonly identity: string
  /** Valid remote content-update time (UTC epoch ms), or null when the record had none. */
  readonly remoteAt: number | null
  /** The raw value the API sent, kept for logs. */
  readonly rawRemoteAt: unknown
}

/** A record the API sent that could not be read; it is counted, logged and skipped. */
export interface MalformedRecord {
  /** The best identity the record offered, for the log line; null when it had none. */
  readonly identity: string | null
  readonly reason: string
}

/** One page of a listing. */
export interface Page {
  readonly records: ReadonlyArray<SourceRecord>
  readonly malformed: ReadonlyArray<MalformedRecord>
  /** Opaque cursor of the next page of the same listing; null at its end. */
  readonly next: string | null
  /** How many HTTP requests the page took (DockerHub pages fetch tags per repository). */
  readonly requests: number
  /** True when the client left records of the page out because the cycle had no room for them. */
  readonly truncated?: boolean
}

/** Why a source request failed. A failure ends the cycle and is recorded on it. */
export class SourceError extends Data.TaggedError("SourceError")<{
  readonly reason: "malformed_page" | "rate_limited" | "http_status" | "network" | "timeout" | "auth"
  readonly source: Source.Source
  readonly url: string
  readonly status?: number
  readonly message: string
}> {}

/**
 * A discovery source: one or more listings (a GitHub search, an organisation,
 * a HuggingFace kind, a DockerHub namespace), each paged by an opaque cursor.
 */
export interface SourceClient {
  readonly source: Source.Source
  /** A human-readable name of each listing, in the order a cycle walks them. */
  readonly listings: ReadonlyArray<string>
  /**
   * Fetches one page of a listing; `cursor` null means its first page. `now` bounds
   * timestamps. `room` is how many more records the cycle will take: a client whose page
   * costs a request per record (DockerHub's tags) stops there, since the rest would not be
   * recorded.
   */
  readonly fetchPage: (listing: number, cursor: string | null, now: number, room?: number) => Effect.Effect<Page, SourceError>
}
