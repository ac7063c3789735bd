/** What every workload gets: the server, the run size, a logger. */
import type { Server } from "./Pg.js"

export interface Ctx {
  readonly pg: Server
  readonly quick: boolean
  readonly runs: number
  readonly log: (line: string) => void
  /** Free-form size overrides from the command line (`--set key=value`). */
  readonly sizes: Readonly<Record<string, number>>
}

/** A size: the command-line override, else the quick or the full default. */
export const size = (ctx: Ctx, key: string, quick: number, full: number): number => ctx.sizes[key] ?? (ctx.quick ? quick : full)

/** Runs `n` concurrent loops until every one has settled; fails with the first failure. */
export const loops = async (n: number, body: (i: number) => Promise<void>): Promise<void> => {
  const settled = await Promise.allSettled(Array.from({ length: n }, (_, i) => body(i)))
  const failed = settled.find((r): r is PromiseRejectedResult => r.status === "rejected")
  if (failed) throw failed.reason
}

/** Seconds since `t0` (from performance.now()). */
export const since = (t0: number) => (performance.now() - t0) / 1000

/** A deterministic PRNG (mulberry32), so every system gets the same data. */
export const prng = (seed: number) => () => {
  seed |= 0
  seed = (seed + 0x6d2b79f5) | 0
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}

export const chunks = <A>(xs: ReadonlyArray<A>, n: number): Array<ReadonlyArray<A>> => {
  const out: Array<ReadonlyArray<A>> = []
  for (let i = 0; i < xs.length; i += n) out.push(xs.slice(i, i + n))
  return out
}
