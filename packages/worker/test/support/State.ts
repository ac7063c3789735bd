import { LocalState } from "@scanfleet/worker"

/** Opens a device's state file, runs `f` on it and closes it again (the device itself stopped or not yet started). */
export const peek = async <A>(file: string, f: (s: LocalState.LocalState) => Promise<A>): Promise<A> => {
  const s = await LocalState.open(file)
  try {
    return await f(s)
  } finally {
    await s.close()
  }
}
