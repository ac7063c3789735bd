import { z } from "zod"

/** The hosting sites scanfleet discovers targets on. */
export const sources = ["github", "gitlab", "huggingface", "dockerhub"] as const

/** One hosting site. */
export type Source = (typeof sources)[number]

/** zod schema of a source name. */
export const SourceSchema = z.enum(sources)

/** True when a source's records carry a remote content-update timestamp usable for promotion. */
export const hasRemoteTimestamp = (source: Source): boolean => source !== "dockerhub"
