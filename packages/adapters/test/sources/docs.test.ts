import { readFileSync } from "node:fs"
import { resolve } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { Config, MemoryStore } from "@scanfleet/core"
import * as FakeSources from "../../src/testing/FakeSources.js"
import * as GitHub from "../../src/sources/GitHub.js"
import { client, cycle } from "./fixtures/Harness.js"

const page = "docs/sources.md"

describe(page, () => {
  it.scopedLive("the documented cycle log line has exactly the fields a real cycle logs", () =>
    Effect.gen(function* () {
      const text = readFileSync(resolve(__dirname, "../../../..", page), "utf8")
      const block = /```json\n(\{"time":"[^"]*","level":"info","message":"discovery_cycle"[^\n]*)\n```/.exec(text)
      expect(block, `${page} shows an example discovery_cycle line`).not.toBeNull()
      const documented = JSON.parse(block![1]) as Record<string, unknown>
      const fakes = yield* FakeSources.scoped()
      fakes.github.put("acme/api", Date.now() - 3_600_000)
      const c = yield* client(GitHub.make({ baseUrl: fakes.github.url, listings: [{ kind: "org", org: "acme" }] }))
      const { summary } = yield* cycle(c, MemoryStore.make(), Config.defaults, Date.now())
      expect(Object.keys(documented).sort()).toEqual(Object.keys(summary).sort())
      for (const k of Object.keys(summary)) expect(typeof documented[k] === typeof summary[k] || documented[k] === null || summary[k] === null, k).toBe(true)
    })
  )
})
