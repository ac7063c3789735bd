import type * as FakeSources from "@scanfleet/adapters/testing/FakeSources"
import type { Source } from "@scanfleet/core"
import { createHash } from "node:crypto"

/**
 * The demo's generated catalogue: a few dozen repositories, projects, Hub
 * repositories and image tags served by the local fake APIs, and the script
 * of how they change while the demo runs. Base timestamps are fixed dates, so
 * a second run over the same data folder sees nothing new in them; each run
 * adds its own few targets (named after the run number) and pushes a few
 * known ones again, so every run shows new and updated work.
 */

/** The marker the demo scanner sleeps on: a target whose identity holds it overruns its target-scan deadline. */
export const slowMarker = "slow"

const day = 86_400_000
const base = Date.UTC(2025, 0, 6, 9, 0, 0)
const at = (days: number) => base + days * day

/** A target that is pushed again once its first scan has completed. */
export interface Change {
  readonly source: Source.Source
  readonly identity: string
  readonly apply: (fakes: FakeSources.FakeSources, now: number) => void
}

/** A target that appears while the demo runs, `afterMs` after it starts. */
export interface Arrival {
  readonly afterMs: number
  readonly label: string
  readonly apply: (fakes: FakeSources.FakeSources, now: number) => void
}

/** A DockerHub digest derived from a name, so the same tag always has the same digest. */
export const digest = (seed: string): string => `sha256:${createHash("sha256").update(seed).digest("hex")}`

/** The GitHub organisations, DockerHub namespaces and HuggingFace kinds the demo lists. */
export const listings = {
  githubOrgs: ["acme", "octo-labs"],
  dockerhubNamespaces: ["acme"]
} as const

/** Fills the fakes with the base catalogue and this run's slow target. */
export const seed = (fakes: FakeSources.FakeSources, run: number): void => {
  const gh = ["acme/web", "acme/api", "acme/cli", "acme/infra", "acme/docs", "octo-labs/parser", "octo-labs/lexer"]
  gh.forEach((name, i) => fakes.github.put(name, at(i)))
  // The target that overruns its deadline: the demo scanner sleeps on the marker in its name.
  fakes.github.put(`octo-labs/${slowMarker}-build-r${run}`, at(30) + run * 1000)

  const gl = ["platform/gateway", "platform/billing", "data/etl", "data/notebooks"]
  gl.forEach((path, i) => fakes.gitlab.put(path, at(10 + i)))

  fakes.huggingface.put("models", "acme/tiny-bert", at(3))
  fakes.huggingface.put("models", "acme/sentiment", at(4))
  fakes.huggingface.put("datasets", "acme/reviews", at(5))
  // Created years ago, modified recently: found because the Hub is listed by lastModified.
  fakes.huggingface.put("spaces", "acme/playground", at(20), Date.UTC(2021, 2, 1))

  fakes.dockerhub.tag("acme/web", "latest", digest("acme/web:latest"), at(7))
  fakes.dockerhub.tag("acme/web", "1.0", digest("acme/web:1.0"), at(6))
  fakes.dockerhub.tag("acme/worker", "latest", digest("acme/worker:latest"), at(8))
}

/** Known targets pushed again once their first scan has completed: each becomes eligible for one updated rescan. */
export const changes: ReadonlyArray<Change> = [
  { source: "github", identity: "acme/api", apply: (f, now) => f.github.push("acme/api", now) },
  { source: "github", identity: "octo-labs/parser", apply: (f, now) => f.github.push("octo-labs/parser", now) },
  { source: "gitlab", identity: "platform/gateway", apply: (f, now) => f.gitlab.touch("platform/gateway", now) },
  { source: "huggingface", identity: "spaces/acme/playground", apply: (f, now) => f.huggingface.put("spaces", "acme/playground", now, Date.UTC(2021, 2, 1)) }
]

/** Targets that appear while the demo runs (new repositories, a new image digest, a new model). */
export const arrivals = (run: number): ReadonlyArray<Arrival> => [
  { afterMs: 12_000, label: `github acme/new-service-r${run}`, apply: (f, now) => f.github.put(`acme/new-service-r${run}`, now) },
  { afterMs: 20_000, label: `dockerhub acme/web:1.${run}`, apply: (f, now) => f.dockerhub.tag("acme/web", `1.${run}`, digest(`acme/web:1.${run}`), now) },
  { afterMs: 28_000, label: `huggingface models/acme/new-model-r${run}`, apply: (f, now) => f.huggingface.put("models", `acme/new-model-r${run}`, now) }
]

// Obviously fake test credentials, shaped as the real ones so secretlint's
// recommended rules match them; none of them was ever issued to anyone.
const fake = {
  githubToken: "ghp_FAKEdemoFAKEdemoFAKEdemoFAKEdemo0001",
  githubToken2: "ghp_FAKEdemoFAKEdemoFAKEdemoFAKEdemo0002",
  slackToken: "xoxb-000000000000-0000000000000-FAKEdemoFAKEdemoFAKEdemo",
  npmToken: "npm_FAKEdemoFAKEdemoFAKEdemoFAKEdemo0003",
  npmToken2: "npm_FAKEdemoFAKEdemoFAKEdemoFAKEdemo0004"
} as const

const note = "# Obviously fake test credential planted by the scanfleet demo; it was never valid.\n"

/** The fixture files of a target's repository: a README for every target, planted fake credentials in a few. */
export const repository = (source: string, identity: string): Readonly<Record<string, string>> => {
  const readme = { "README.md": `# ${identity}\n\nA ${source} target of the scanfleet demo.\n` }
  switch (`${source}:${identity}`) {
    case "github:acme/api":
      return { ...readme, "config/deploy.env": `${note}GITHUB_TOKEN=${fake.githubToken}\n`, "config/chat.env": `${note}SLACK_BOT_TOKEN=${fake.slackToken}\n` }
    case "github:octo-labs/parser":
      return { ...readme, ".npmrc": `${note}//registry.npmjs.org/:_authToken=${fake.npmToken}\n` }
    case "gitlab:platform/gateway":
      return { ...readme, "deploy/ci.env": `${note}GITHUB_TOKEN=${fake.githubToken2}\n` }
    default:
      return readme
  }
}

/** What each push of `changes` commits to the target's repository before its remote timestamp moves. */
export const commits: Readonly<Record<string, { readonly write?: Readonly<Record<string, string>>; readonly remove?: ReadonlyArray<string>; readonly message: string }>> = {
  // one secret added, one removed, one kept: the rescan shows one new, one resolved, one still present
  "github:acme/api": { remove: ["config/chat.env"], write: { "ci/.npmrc": `${note}//registry.npmjs.org/:_authToken=${fake.npmToken2}\n` }, message: "move chat settings out; add CI registry auth" },
  "github:octo-labs/parser": { remove: [".npmrc"], message: "remove the registry token" },
  "gitlab:platform/gateway": { write: { "CHANGELOG.md": "- gateway: retries\n" }, message: "changelog" }
}
