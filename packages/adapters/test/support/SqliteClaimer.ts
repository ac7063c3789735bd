// A separate process that, for several rounds, claims every slot of one device
// in a shared SQLite file and gives the claims back (keeping the last round's),
// then prints what it got: `node --import tsx SqliteClaimer.ts <file> <deviceId> <slots> <rounds>`.
import { Effect } from "effect"
import { Config, Store } from "@scanfleet/core"
import * as SqliteStore from "../../src/SqliteStore.js"

const [filename, deviceId, slots, rounds] = process.argv.slice(2)

const program = Effect.gen(function* () {
  const store = yield* Store.Store
  let won: Array<string> = []
  const refused: Array<string> = []
  for (let round = 0; round < Number(rounds); round++) {
    const held = []
    for (let slot = 0; slot < Number(slots); slot++) {
      const now = Date.UTC(2025, 0, 1) + round
      const r = yield* Effect.either(store.claim({ deviceId: Number(deviceId), slot, now, config: Config.defaults }))
      if (r._tag === "Left") refused.push(`${r.left._tag}:${r.left.reason}`)
      else if (r.right) held.push(r.right)
    }
    won = held.map((a) => a.identity)
    if (round < Number(rounds) - 1)
      for (const a of held) yield* store.release({ deviceId: a.deviceId, reservationId: a.reservationId, fence: a.fence, now: Date.UTC(2025, 0, 1) + round })
  }
  process.stdout.write(JSON.stringify({ won, refused }))
})

Effect.runPromise(program.pipe(Effect.provide(SqliteStore.layer({ filename })))).catch((e) => {
  process.stderr.write(String(e))
  process.exit(1)
})
