import { existsSync, readdirSync, readFileSync } from "node:fs"
import { fileURLToPath, pathToFileURL } from "node:url"
import { describe, expect, it } from "@effect/vitest"
import { vi } from "vitest"

const root = fileURLToPath(new URL("../../../", import.meta.url))

/** Each concept page and the example file it includes verbatim. */
const pages = [
  { page: "docs/concepts/targets-and-promotion.md", example: "docs/examples/targets-and-promotion.ts" },
  { page: "docs/concepts/assignments-deadlines-and-phases.md", example: "docs/examples/assignments-deadlines-and-phases.ts" }
]

const tsBlocks = (markdown: string): Array<string> => [...markdown.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((m) => m[1])

describe("docs examples", () => {
  for (const { page, example } of pages) {
    it(`${page} shows ${example} exactly as it is`, () => {
      const code = readFileSync(root + example, "utf8")
      expect(tsBlocks(readFileSync(root + page, "utf8"))).toContain(code)
    })

    it(`${example} runs`, async () => {
      const log = vi.spyOn(console, "log").mockImplementation(() => {})
      try {
        await import(pathToFileURL(root + example).href)
        expect(log).toHaveBeenCalled()
      } finally {
        log.mockRestore()
      }
    })
  }

  it("docs/index.md links the concept pages and every top-level, concept and adapter page under docs/", () => {
    const index = readFileSync(root + "docs/index.md", "utf8")
    const links = [...index.matchAll(/\]\(([^)#]+)\)/g)].map((m) => m[1])
    const written = ["", "concepts/", "adapters/"].flatMap((dir) =>
      existsSync(root + "docs/" + dir) ? readdirSync(root + "docs/" + dir).filter((f) => f.endsWith(".md") && f !== "index.md").map((f) => dir + f) : []
    )
    for (const page of [...pages.map((p) => p.page.replace(/^docs\//, "")), ...written]) expect(links).toContain(page)
    // Links stay inside docs/, so the pages work wherever docs/ is published.
    for (const l of links) expect(l.startsWith("/") || l.startsWith("..") || l.includes("://")).toBe(false)
  })
})
