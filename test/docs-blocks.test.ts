import { execFile } from "node:child_process"
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { join, relative, resolve } from "node:path"
import { promisify } from "node:util"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest"

/**
 * Every fenced code block in docs/**\/*.md, the root README and the package
 * READMEs must run as written, or be a tested example file the page includes
 * verbatim. A block is covered when one of these holds:
 *
 * 1. Example file. The block is the exact content of a file under
 *    `docs/examples/` (optionally naming it on its first line,
 *    `// file: docs/examples/x.ts` or `# file: docs/examples/x.sh`). This test
 *    runs each included `.ts`, `.mjs`, `.js` and `.sh` example; any other kind
 *    (a JSON document) must be named by some test file under `test/` or
 *    `packages/*\/test/`, which checks it.
 * 2. `<!-- run -->` on the line before the block (blank lines allowed): the
 *    block itself runs here, in a scratch folder inside the checkout
 *    (`.data/docs-sandbox-*`, so `@scanfleet/*` and the tools in
 *    node_modules resolve): `ts`/`js` blocks with tsx, `sh`/`bash` blocks
 *    with `bash -euo pipefail`. Each must finish within two minutes.
 * 3. `<!-- covered-by: path/to/some.test.ts -->` on the line before the block:
 *    that test file exists and names the page's path (for example
 *    `docs/getting-started.md`), so the link is deliberate on both sides. Use it
 *    for commands that must not run here (`npm ci`, long-running servers).
 * 4. Generated pages listed in `generated` below, each with the test that
 *    compares the page with its source.
 *
 * Examples and blocks get `DATABASE_URL`, a fresh PostgreSQL database of their own.
 */

const root = resolve(__dirname, "..")

/** Pages whose blocks are generated from code and compared by another test. */
const generated: ReadonlyArray<{ readonly prefix: string; readonly coveredBy: string; readonly why: string }> = [
  { prefix: "docs/api/", coveredBy: "packages/server-example/test/ApiReference.test.ts", why: "generated from the zod contract schemas and compared with them" }
]

interface Block {
  readonly page: string
  /** 1-based line of the opening fence. */
  readonly line: number
  readonly lang: string
  readonly code: string
  /** The marker on the line before the block, if any. */
  readonly marker: { readonly kind: "run" } | { readonly kind: "covered-by"; readonly path: string } | null
}

const walk = (dir: string): Array<string> =>
  existsSync(dir)
    ? readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? walk(join(dir, e.name)) : e.name.endsWith(".md") ? [join(dir, e.name)] : []))
    : []

const pages = (): Array<string> =>
  [
    ...walk(join(root, "docs")),
    join(root, "README.md"),
    ...readdirSync(join(root, "packages")).map((p) => join(root, "packages", p, "README.md"))
  ]
    .filter((f) => existsSync(f))
    .map((f) => relative(root, f))
    .sort()

/** The fenced blocks of a page (``` or ~~~ fences, info string's first word as the language). */
const blocks = (page: string, text: string): Array<Block> => {
  const lines = text.split("\n")
  const out: Array<Block> = []
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)(`{3,}|~{3,})\s*([\w+-]*)/.exec(lines[i])
    if (!open) continue
    const fence = open[2]
    let j = i + 1
    while (j < lines.length && !new RegExp(`^\\s*${fence[0]}{${fence.length},}\\s*$`).test(lines[j])) j++
    let k = i - 1
    while (k >= 0 && lines[k].trim() === "") k--
    const prev = k >= 0 ? lines[k].trim() : ""
    const run = /^<!--\s*run\s*-->$/.test(prev)
    const covered = /^<!--\s*covered-by:\s*(\S+)\s*-->$/.exec(prev)
    out.push({
      page,
      line: i + 1,
      lang: open[3].toLowerCase(),
      code: lines.slice(i + 1, j).join("\n") + "\n",
      marker: run ? { kind: "run" } : covered ? { kind: "covered-by", path: covered[1] } : null
    })
    i = j
  }
  return out
}

const examplesDir = join(root, "docs", "examples")
const exampleFiles = (): Array<string> =>
  existsSync(examplesDir)
    ? (function all(d: string): Array<string> {
        return readdirSync(d, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? all(join(d, e.name)) : [relative(root, join(d, e.name))]))
      })(examplesDir)
    : []

const runnable = (file: string) => /\.(ts|mts|mjs|js|sh)$/.test(file)
const tsLangs = new Set(["ts", "typescript", "js", "javascript", "mjs", "mts"])
const shLangs = new Set(["sh", "bash", "shell"])

const testFiles = (): Array<string> => {
  const all = (d: string): Array<string> =>
    existsSync(d)
      ? readdirSync(d, { withFileTypes: true }).flatMap((e) =>
          e.name === "node_modules" ? [] : e.isDirectory() ? all(join(d, e.name)) : /\.test\.ts$|Suite\.ts$/.test(e.name) ? [join(d, e.name)] : []
        )
      : []
  return [...all(join(root, "test")), ...readdirSync(join(root, "packages")).flatMap((p) => all(join(root, "packages", p, "test")))]
}

/** Why a block is covered, or null when it is not. */
const coverage = (b: Block, examples: ReadonlyMap<string, string>): string | null => {
  const g = generated.find((x) => b.page.startsWith(x.prefix))
  if (g) return `generated: ${g.coveredBy}`
  const named = /^(?:\/\/|#)\s*file:\s*(\S+)/.exec(b.code)?.[1]
  if (named) return examples.get(named) === b.code ? `example ${named}` : null
  for (const [file, text] of examples) if (text === b.code) return `example ${file}`
  if (b.marker?.kind === "run") return tsLangs.has(b.lang) || shLangs.has(b.lang) ? "run" : null
  if (b.marker?.kind === "covered-by") {
    const f = join(root, b.marker.path)
    return existsSync(f) && readFileSync(f, "utf8").includes(b.page) ? `covered by ${b.marker.path}` : null
  }
  return null
}

const sandboxRoot = join(root, ".data")
let pgUrl = ""
let dbName = ""
let admin: pg.Client | null = null

beforeAll(async () => {
  mkdirSync(sandboxRoot, { recursive: true })
  const base = inject("pgUrl")
  admin = new pg.Client({ connectionString: base })
  await admin.connect()
  dbName = `sf_docs_${Math.random().toString(36).slice(2, 10)}`
  await admin.query(`CREATE DATABASE ${dbName}`)
  const u = new URL(base)
  u.pathname = `/${dbName}`
  pgUrl = u.toString()
})

afterAll(async () => {
  if (admin) {
    await admin.query(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`).catch(() => {})
    await admin.end()
  }
})

// Asynchronous, so a long example never blocks the test worker past vitest's RPC heartbeat.
const execFileAsync = promisify(execFile)
const execute = async (file: string, cwd: string) => {
  const isSh = file.endsWith(".sh")
  const cmd = isSh ? "bash" : process.execPath
  const args = isSh ? ["-euo", "pipefail", file] : ["--conditions=@scanfleet/source", "--import", "tsx", file]
  try {
    return (
      await execFileAsync(cmd, args, {
        cwd,
        encoding: "utf8",
        timeout: 120_000,
        maxBuffer: 16 * 1024 * 1024,
        env: { ...process.env, DATABASE_URL: pgUrl, PATH: `${join(root, "node_modules", ".bin")}:${process.env.PATH}` }
      })
    ).stdout
  } catch (e) {
    const err = e as { code?: number; signal?: string; stdout?: string; stderr?: string }
    throw new Error(`${relative(root, file)} failed (${err.signal ?? `exit ${err.code}`}):\n${(err.stdout ?? "").slice(-2000)}\n${(err.stderr ?? "").slice(-3000)}`)
  }
}

const examples = new Map(exampleFiles().map((f) => [f, readFileSync(join(root, f), "utf8")]))
const all = pages().map((p) => ({ page: p, blocks: blocks(p, readFileSync(join(root, p), "utf8")) }))

describe("every code block in the docs runs as written or is a tested example", () => {
  it("the block finder sees fences, languages and markers", () => {
    const found = blocks("x.md", "intro\n<!-- run -->\n\n```ts\nconsole.log(1)\n```\n\n<!-- covered-by: test/a.test.ts -->\n~~~sh\nnpm ci\n~~~\n```\nplain\n```\n")
    expect(found.map((b) => [b.line, b.lang, b.code, b.marker])).toEqual([
      [4, "ts", "console.log(1)\n", { kind: "run" }],
      [9, "sh", "npm ci\n", { kind: "covered-by", path: "test/a.test.ts" }],
      [12, "", "plain\n", null]
    ])
  })

  for (const { page, blocks: bs } of all) {
    it(`${page}: every block is covered`, () => {
      const missing = bs.filter((b) => coverage(b, examples) === null)
      if (missing.length > 0)
        throw new Error(
          `${missing.length} code block(s) in ${page} neither run nor are a tested example:\n` +
            missing.map((b) => `  ${page}:${b.line} (\`\`\`${b.lang || "no language"}) ${JSON.stringify(b.code.split("\n")[0].slice(0, 80))}`).join("\n") +
            `\nCover each one: make it the exact content of a file under docs/examples/ (run by this test), put <!-- run --> on the line before it ` +
            `(it then runs here as written), or <!-- covered-by: path/to/x.test.ts --> naming a test that mentions ${page}. See test/docs-blocks.test.ts.`
        )
    })
  }

  const included = [...new Set(all.flatMap((p) => p.blocks.map((b) => coverage(b, examples)).filter((c): c is string => c?.startsWith("example ") ?? false)))]
    .map((c) => c.slice("example ".length))
    .sort()
  for (const file of included) {
    if (runnable(file))
      it(`${file} (included in the docs) runs`, async () => {
        await execute(join(root, file), root)
      }, 150_000)
    else
      it(`${file} (included in the docs) is checked by a test`, () => {
        const checkers = testFiles().filter((t) => readFileSync(t, "utf8").includes(file))
        expect(checkers, `no test names ${file}`).not.toEqual([])
      })
  }

  const runs = all.flatMap((p) => p.blocks.filter((b) => b.marker?.kind === "run" && (tsLangs.has(b.lang) || shLangs.has(b.lang))))
  for (const b of runs)
    it(`${b.page}:${b.line} (\`\`\`${b.lang}) runs as written`, async () => {
      const dir = mkdtempSync(join(sandboxRoot, "docs-sandbox-"))
      try {
        const file = join(dir, shLangs.has(b.lang) ? "block.sh" : b.lang.startsWith("j") || b.lang === "mjs" ? "block.mjs" : "block.ts")
        writeFileSync(file, b.code)
        await execute(file, dir)
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    }, 150_000)
})
