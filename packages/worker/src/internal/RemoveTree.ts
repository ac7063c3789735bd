import { Effect } from "effect"
import { spawn } from "node:child_process"
import { rm } from "node:fs/promises"

/** Why a tree could not be removed. */
export class RemoveFailed extends Error {}

/**
 * Deletes a directory tree in a child process (`rm -rf`). `fs.promises.rm` walks the tree on
 * this process's event loop: a work folder of 120,000 empty files held the loop for 0.6 s at a
 * time, and 3.4 s beside a scanner filling another folder, while the other slots' deadlines,
 * uploads and heartbeats waited. Where `rm` cannot be started, `fs.promises.rm` does it.
 * Interrupted (the device stops), the removal goes on without holding the process open, as the
 * promise of `fs.promises.rm` did; should the process end first, whoever sweeps next removes the rest.
 */
export const removeTree = (dir: string): Effect.Effect<void, RemoveFailed> =>
  Effect.async<void, RemoveFailed>((resume) => {
    let settled = false
    const settle = (effect: Effect.Effect<void, RemoveFailed>) => {
      if (settled) return
      settled = true
      resume(effect)
    }
    const child = spawn("rm", ["-rf", "--", dir], { stdio: ["ignore", "ignore", "pipe"] })
    let stderr = ""
    child.stderr.setEncoding("utf8").on("data", (d: string) => {
      if (stderr.length < 2000) stderr += d
    })
    child.once("error", () =>
      settle(Effect.tryPromise({ try: () => rm(dir, { recursive: true, force: true }), catch: (e) => new RemoveFailed(e instanceof Error ? e.message : String(e)) }))
    )
    child.once("close", (code, signal) =>
      settle(code === 0 ? Effect.void : Effect.fail(new RemoveFailed(stderr.trim().split("\n")[0] || `rm ended with ${code ?? signal}`)))
    )
    return Effect.sync(() => {
      settled = true
      child.unref()
      // The pipe would hold the event loop as the child would.
      ;(child.stderr as unknown as { readonly unref?: () => void }).unref?.()
    })
  })
