/**
 * Polls `f` every `everyMs` until it gives a truthy value, which it returns; fails naming `what`
 * after `ms`. The bound is for a loaded machine, not a claim about speed.
 */
export const until = async <A>(what: string, f: () => Promise<A | undefined | null | false> | A | undefined | null | false, ms: number, everyMs = 25): Promise<A> => {
  const end = Date.now() + ms
  for (;;) {
    const v = await f()
    if (v) return v
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, everyMs))
  }
}
