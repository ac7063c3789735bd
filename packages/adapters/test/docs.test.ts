import { existsSync, readFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "vitest"

const root = fileURLToPath(new URL("../../../", import.meta.url))
const read = (path: string) => readFileSync(root + path, "utf8")
const blocks = (page: string) => [...read(page).matchAll(/^```(\w+)\n([\s\S]*?)^```$/gm)].map((m) => ({ lang: m[1], code: m[2] }))

/** Which tested file each code block of the adapter pages shows verbatim. */
const shown: ReadonlyArray<{ readonly page: string; readonly files: ReadonlyArray<string> }> = [
  { page: "docs/adapters/postgres.md", files: ["docs/examples/postgres-store.ts"] },
  { page: "docs/adapters/sqlite.md", files: ["docs/examples/sqlite-store.ts"] },
  { page: "docs/adapters/writing-an-adapter.md", files: ["packages/adapters/test/examples/TracedStore.ts", "packages/adapters/test/examples/TracedStore.test.ts"] }
]

describe("the adapter pages", () => {
  for (const { page, files } of shown) {
    it(`${page} shows its tested examples verbatim`, () => {
      const code = blocks(page).filter((b) => b.lang === "ts").map((b) => b.code)
      expect(code).toEqual(files.map(read))
    })

    it(`${page} runs only test files that exist`, () => {
      for (const b of blocks(page).filter((b) => b.lang === "sh"))
        for (const m of b.code.matchAll(/npx vitest run (\S+)/g)) expect(existsSync(root + m[1]), m[1]).toBe(true)
    })
  }

  it("docs/examples/postgres-store.ts is the SQLite example with the PostgreSQL layer", () => {
    const body = (path: string) => read(path).split("\n").filter((l) => !l.startsWith("import") && !l.startsWith("//") && !l.startsWith("const") && !l.startsWith("await") && !l.startsWith("// "))
    expect(body("docs/examples/postgres-store.ts")).toEqual(body("docs/examples/sqlite-store.ts"))
  })
})
