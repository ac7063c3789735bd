import { readFileSync, readdirSync } from "node:fs"
import { join, resolve } from "node:path"
import { describe, expect, it } from "vitest"

// The benchmark takes minutes and is never a test; what a test can hold is that
// the commands docs/performance.md tells a user to paste are the ones bench/ accepts.
const root = resolve(__dirname, "..")
const page = "docs/performance.md"
const read = (p: string) => readFileSync(join(root, p), "utf8")

describe(`${page}: the reproduce commands`, () => {
  const text = read(page)
  const block = /## Reproduce\s+(?:<!--[^\n]*-->\s+)?```sh\n([\s\S]*?)```/.exec(text)
  const lines = (block?.[1] ?? "").split("\n").map((l) => l.replace(/#.*$/, "").trim()).filter((l) => l !== "")
  const main = read("bench/src/main.ts")
  const accepted = new Set([...main.matchAll(/(?:flag|option)\("([\w-]+)"\)/g)].map((m) => m[1]).concat(/"--set"/.test(main) ? ["set"] : []))
  const workloads = new Set([...main.matchAll(/\["(\d)", /g)].map((m) => m[1]))
  const sources = readdirSync(join(root, "bench/src/workloads")).map((f) => read(`bench/src/workloads/${f}`)).join("\n")

  it("has a reproduce block of npm commands", () => {
    expect(lines.length).toBeGreaterThan(1)
    for (const l of lines) expect(l, l).toMatch(/^npm (ci|run bench)\b/)
  })

  it("names scripts that exist: npm run bench at the root, and bench/'s own bench script", () => {
    expect(JSON.parse(read("package.json")).scripts.bench).toContain("bench")
    expect(JSON.parse(read("bench/package.json")).scripts.bench).toBeDefined()
  })

  it("passes only flags the bench reads, workload ids it has, and sizes it uses", () => {
    for (const l of lines.filter((l) => l.startsWith("npm run bench -- "))) {
      const args = l.slice("npm run bench -- ".length).split(/\s+/)
      for (let i = 0; i < args.length; i++) {
        if (!args[i].startsWith("--")) continue
        const name = args[i].slice(2)
        expect(accepted, `${l}: --${name}`).toContain(name)
        if (name === "only") for (const id of args[i + 1].split(",")) expect(workloads, `${l}: workload ${id}`).toContain(id)
        if (name === "set") expect(sources, `${l}: size ${args[i + 1]}`).toContain(`"${args[i + 1].split("=")[0]}"`)
      }
    }
  })
})
