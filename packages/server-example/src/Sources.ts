import { DockerHub, GitHub, GitLab, HuggingFace } from "@scanfleet/adapters"
import { Effect } from "effect"
import { readFileSync } from "node:fs"
import { z } from "zod"
import type * as Scheduler from "./Scheduler.js"

const Limits = z.object({ maxPages: z.number().int().min(1).max(10_000), maxResults: z.number().int().min(1).max(10_000_000) }).strict()

/**
 * The discovery sources file: which listings of which public APIs to walk,
 * how often, and within which hard limits. Tokens never live here; they come
 * from the environment (`GITHUB_TOKEN`, `GITLAB_TOKEN`, `HF_TOKEN`,
 * `DOCKERHUB_USERNAME` + `DOCKERHUB_TOKEN`).
 */
export const SourcesFileSchema = z
  .object({
    github: z
      .object({
        listings: z
          .array(
            z.union([
              z.object({ kind: z.literal("search"), query: z.string().min(1) }).strict(),
              z.object({ kind: z.literal("org"), org: z.string().min(1) }).strict(),
              z.object({ kind: z.literal("user"), user: z.string().min(1) }).strict()
            ])
          )
          .min(1),
        baseUrl: z.string().url().optional()
      })
      .strict()
      .optional(),
    gitlab: z.object({ baseUrl: z.string().url().optional(), params: z.record(z.string(), z.string()).optional() }).strict().optional(),
    huggingface: z
      .object({ kinds: z.array(z.enum(["models", "datasets", "spaces"])).min(1).optional(), params: z.record(z.string(), z.string()).optional(), baseUrl: z.string().url().optional() })
      .strict()
      .optional(),
    dockerhub: z.object({ namespaces: z.array(z.string().min(1)).min(1), baseUrl: z.string().url().optional() }).strict().optional(),
    /** Minutes between two cycles of one source (default 5). */
    intervalMinutes: z.number().min(0.05).max(1440).optional(),
    /** Hard limits of every cycle (default 3 pages, 300 results). */
    limits: Limits.optional(),
    /** The discovery lease period in seconds (default 30): with several server instances, a dead leader is replaced this long (plus a tenth) after its last renewal. */
    leaseSeconds: z.number().min(0.5).max(3600).optional()
  })
  .strict()

/** A parsed sources file. */
export type SourcesFile = z.infer<typeof SourcesFileSchema>

/** A sources file that cannot be used, with the field at fault. */
export class SourcesFileError extends Error {}

/** Reads and validates a sources file; the error names the file and every field at fault. */
export const load = (file: string): SourcesFile => {
  let raw: unknown
  try {
    raw = JSON.parse(readFileSync(file, "utf8"))
  } catch (e) {
    throw new SourcesFileError(`${file}: ${(e as Error).message}`)
  }
  const parsed = SourcesFileSchema.safeParse(raw)
  if (!parsed.success) throw new SourcesFileError(`${file}: ${parsed.error.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ")}`)
  const d = parsed.data
  if (!d.github && !d.gitlab && !d.huggingface && !d.dockerhub)
    throw new SourcesFileError(`${file}: names no source; give at least one of github, gitlab, huggingface, dockerhub`)
  return d
}

// Only the settings given are passed on, so each client keeps its own defaults for the rest.
const given = <A extends object>(a: A): Partial<A> => Object.fromEntries(Object.entries(a).filter(([, v]) => v !== undefined && v !== "")) as Partial<A>

/** The discovery lease options a sources file sets. */
export const lease = (s: SourcesFile): Scheduler.LeaseOptions => ({ leaseMs: Math.round((s.leaseSeconds ?? 30) * 1000) })

/** One schedule per source named in the file, with its token from the environment. */
export const schedules = (s: SourcesFile, env: Record<string, string | undefined>) =>
  Effect.gen(function* () {
    const limits = s.limits ?? { maxPages: 3, maxResults: 300 }
    const intervalMs = Math.round((s.intervalMinutes ?? 5) * 60_000)
    const every = (client: Scheduler.SourceSchedule["client"]): Scheduler.SourceSchedule => ({ client, intervalMs, jitterMs: Math.round(intervalMs / 10), limits })
    const out: Array<Scheduler.SourceSchedule> = []
    if (s.github) out.push(every(yield* GitHub.make({ listings: s.github.listings, ...given({ baseUrl: s.github.baseUrl, token: env.GITHUB_TOKEN }) })))
    if (s.gitlab) out.push(every(yield* GitLab.make(given({ baseUrl: s.gitlab.baseUrl, params: s.gitlab.params, token: env.GITLAB_TOKEN }))))
    if (s.huggingface)
      out.push(every(yield* HuggingFace.make(given({ baseUrl: s.huggingface.baseUrl, kinds: s.huggingface.kinds, params: s.huggingface.params, token: env.HF_TOKEN }))))
    if (s.dockerhub)
      out.push(
        every(yield* DockerHub.make({ namespaces: s.dockerhub.namespaces, ...given({ baseUrl: s.dockerhub.baseUrl, username: env.DOCKERHUB_USERNAME, token: env.DOCKERHUB_TOKEN }) }))
      )
    if (out.length === 0) throw new SourcesFileError("the sources file names no source: give at least one of github, gitlab, huggingface, dockerhub")
    return out
  })
