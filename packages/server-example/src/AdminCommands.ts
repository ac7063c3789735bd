import { Args, Command, Options } from "@effect/cli"
import { Source, Target } from "@scanfleet/core"
import { CommandLine } from "@scanfleet/worker"
import { Effect, Option } from "effect"
import { readFileSync } from "node:fs"

/** An operator command line that cannot be run as given. */
export class UsageError extends Error {}

/** The answer of one admin API call. */
interface Answer {
  readonly status: number
  readonly body: any
}

const need = (flags: Map<string, string>, name: string): string => {
  const v = flags.get(name)
  if (v === undefined || v === "") throw new UsageError(`--${name} is required`)
  return v
}

const sourceOf = (v: string): Source.Source => {
  const r = Source.SourceSchema.safeParse(v)
  if (!r.success) throw new UsageError(`--source must be one of ${Source.sources.join(", ")}`)
  return r.data
}

/** A client of the admin API of one server. */
export const client = (flags: Map<string, string>, env: Record<string, string | undefined>) => {
  const base = (flags.get("server") ?? env.SCANFLEET_SERVER_URL ?? "http://127.0.0.1:8080").replace(/\/+$/, "")
  const token = env.SCANFLEET_ADMIN_TOKEN
  if (!token) throw new UsageError("SCANFLEET_ADMIN_TOKEN must hold the server's admin token")
  // A header carries bytes: the actor's UTF-8 bytes, one character each, as fetch sends a header.
  const actor = Buffer.from(flags.get("actor") ?? env.USER ?? "cli", "utf8").toString("latin1")
  return async (method: string, path: string, body?: unknown): Promise<Answer> => {
    const res = await fetch(base + path, {
      method,
      headers: { authorization: `Bearer ${token}`, "x-scanfleet-actor": actor, ...(body === undefined ? {} : { "content-type": "application/json" }) },
      body: body === undefined ? undefined : JSON.stringify(body)
    })
    const text = await res.text()
    let parsed: unknown = text
    try {
      parsed = JSON.parse(text)
    } catch {
      // not JSON: keep the text
    }
    return { status: res.status, body: parsed }
  }
}

const query = (pairs: Record<string, string | undefined>) => {
  const q = new URLSearchParams()
  for (const [k, v] of Object.entries(pairs)) if (v !== undefined) q.set(k, v)
  const s = q.toString()
  return s === "" ? "" : `?${s}`
}

// Prints an answer: JSON on stdout when it succeeded, the refusal on stderr (exit 1) when not.
const print = (a: Answer): number => {
  if (a.status >= 200 && a.status < 300) {
    console.log(JSON.stringify(a.body, null, 2))
    return 0
  }
  const b = a.body as { error?: string; message?: string; issues?: Array<{ path: Array<string | number>; message: string }> }
  console.error(`refused (${a.status} ${b?.error ?? ""}): ${b?.message ?? String(a.body)}`)
  for (const i of b?.issues ?? []) console.error(`  ${i.path.join(".") || "(root)"}: ${i.message}`)
  return 1
}

const readTargets = (file: string) =>
  readFileSync(file, "utf8")
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l.length > 0)
    .map((l, i) => {
      try {
        return JSON.parse(l) as unknown
      } catch (e) {
        throw new UsageError(`${file} line ${i + 1} is not JSON: ${(e as Error).message}`)
      }
    })

/**
 * Runs one operator command against a running server's admin API; null when the words name
 * no operator command (the caller tries its own).
 *
 * @example
 * await AdminCommands.run(["sources", "pause", "gitlab"], new Map([["reason", "rate limited"]]), process.env)
 */
export const run = async (words: ReadonlyArray<string>, flags: Map<string, string>, env: Record<string, string | undefined>): Promise<number | null> => {
  const [group, verb, arg] = words
  if (!["targets", "assignments", "sources", "devices", "audit"].includes(group ?? "")) return null
  const call = client(flags, env)
  const reason = () => need(flags, "reason")
  switch (`${group} ${verb ?? ""}`.trim()) {
    case "targets add": {
      const targets = flags.has("file")
        ? readTargets(need(flags, "file"))
        : [{ source: sourceOf(need(flags, "source")), identity: need(flags, "identity"), ...(flags.has("remote-at") ? { remoteAt: flags.get("remote-at") } : {}) }]
      return print(await call("POST", "/v1/admin/targets", { targets, reason: reason() }))
    }
    case "targets search":
      return print(
        await call(
          "GET",
          `/v1/admin/targets/search${query({ source: flags.get("source"), status: flags.get("status"), prefix: flags.get("prefix"), changedSince: flags.get("changed-since"), after: flags.get("after"), limit: flags.get("limit") })}`
        )
      )
    case "targets inspect":
      return print(await call("GET", `/v1/admin/targets/inspect${query({ source: sourceOf(need(flags, "source")), identity: need(flags, "identity"), limit: flags.get("limit") })}`))
    case "targets requeue": {
      const source = sourceOf(need(flags, "source"))
      const why = reason()
      if (!flags.has("status")) return print(await call("POST", "/v1/admin/targets/requeue", { source, identity: need(flags, "identity"), reason: why }))
      const status = Target.StatusSchema.safeParse(flags.get("status"))
      if (!status.success || (status.data !== "failed" && status.data !== "unresolved")) throw new UsageError("--status must be failed or unresolved")
      // Page through the matching targets (each requeue moves one out of the filter, so the cursor stays valid).
      let after: string | undefined
      let requeued = 0
      for (;;) {
        const page = await call("GET", `/v1/admin/targets/search${query({ source, status: status.data, after, limit: "200" })}`)
        if (page.status !== 200) return print(page)
        for (const t of page.body.targets) {
          const r = await call("POST", "/v1/admin/targets/requeue", { source, identity: t.identity, reason: why })
          if (r.status === 200) requeued++
          else if (r.status !== 409) return print(r)
        }
        if (page.body.next === null) break
        after = String(page.body.next)
      }
      console.log(JSON.stringify({ requeued }))
      return 0
    }
    case "targets priority": {
      const raw = need(flags, "priority")
      // the server checks the range and names the field; here only a number is required to send one
      if (!/^[+-]?\d+$/.test(raw.trim())) throw new UsageError("--priority must be an integer from -100 to 100")
      return print(await call("POST", "/v1/admin/targets/priority", { source: sourceOf(need(flags, "source")), identity: need(flags, "identity"), priority: Number(raw), reason: reason() }))
    }
    case "assignments cancel":
      if (!arg) throw new UsageError("assignments cancel needs the reservation id")
      return print(await call("POST", `/v1/admin/assignments/${encodeURIComponent(arg)}/cancel`, { reason: reason() }))
    case "sources list":
      return print(await call("GET", "/v1/admin/sources"))
    case "sources pause":
    case "sources resume":
      if (!arg) throw new UsageError(`sources ${verb} needs the source`)
      return print(await call("POST", `/v1/admin/sources/${encodeURIComponent(sourceOf(arg))}/${verb}`, { reason: reason() }))
    case "devices list":
      return print(await call("GET", "/v1/admin/devices"))
    case "devices only": {
      if (!arg) throw new UsageError("devices only needs the device id")
      const list = need(flags, "sources")
      const sources = list === "all" ? null : list === "none" ? [] : list.split(",").map((s) => sourceOf(s.trim()))
      return print(await call("POST", `/v1/admin/devices/${encodeURIComponent(arg)}/sources`, { sources, reason: reason() }))
    }
    case "devices revoke":
      if (!arg) throw new UsageError("devices revoke needs the device id")
      return print(await call("DELETE", `/v1/admin/devices/${encodeURIComponent(arg)}${query({ reason: reason() })}`))
    case "audit":
      return print(await call("GET", `/v1/admin/audit${query({ limit: flags.get("limit"), before: flags.get("before") })}`))
    default:
      throw new UsageError(`unknown command: ${words.join(" ")}`)
  }
}

// The operator commands as `scanfleet-server` subcommands. Each collects its flags into the same
// map `run` reads, so the command line and the admin API calls have one implementation.

const described = (name: string, what: string) => Options.text(name).pipe(Options.withDescription(what), Options.optional)

const connection = {
  server: described("server", "the running server's URL (env SCANFLEET_SERVER_URL, default http://127.0.0.1:8080); the admin token comes from SCANFLEET_ADMIN_TOKEN"),
  actor: described("actor", "who is recorded in the audit log (env USER)")
}
const reasonOption = described("reason", "required: why, recorded in the audit log")
const sourceOption = described("source", `the source: ${Source.sources.join(", ")}`)
const identityOption = described("identity", "the target's identity within its source")
const limitOption = described("limit", "how many entries")

type Given = Record<string, Option.Option<string>>

const invoke = (words: ReadonlyArray<string>, given: Given) =>
  Effect.gen(function* () {
    const flags = new Map<string, string>()
    for (const [k, v] of Object.entries(given)) if (Option.isSome(v)) flags.set(k, v.value)
    const code = yield* Effect.tryPromise({
      try: () => run(words, flags, process.env),
      catch: (e) => (e instanceof UsageError ? new CommandLine.UsageError({ message: e.message }) : new CommandLine.CommandFailed({ message: `failed: ${(e as Error).message}` }))
    })
    // The refusal (status, message, fields) is already on stderr.
    if (code !== 0) return yield* new CommandLine.CommandFailed({ message: "the server refused the command", code: code ?? 1 })
  })

const plain = <const O extends Record<string, Options.Options<Option.Option<string>>>>(name: string, words: ReadonlyArray<string>, options: O, description: string) =>
  Command.make(name, { ...connection, ...options }, (given) => invoke(words, given as unknown as Given)).pipe(Command.withDescription(description))

const withArg = <const O extends Record<string, Options.Options<Option.Option<string>>>>(name: string, words: ReadonlyArray<string>, arg: string, options: O, description: string) =>
  Command.make(name, { ...connection, ...options, arg: Args.text({ name: arg }) }, (all) => {
    const { arg: value, ...given } = all as unknown as Given & { readonly arg: string }
    return invoke([...words, value], given as Given)
  }).pipe(
    Command.withDescription(description)
  )

const targets = Command.make("targets").pipe(
  Command.withDescription("find, add and redrive targets"),
  Command.withSubcommands([
    plain(
      "add",
      ["targets", "add"],
      {
        source: sourceOption,
        identity: identityOption,
        "remote-at": described("remote-at", "the target's remote change time (ISO)"),
        file: described("file", 'a JSON lines file, one {"source","identity","remoteAt"?} object a line, instead of --source and --identity'),
        reason: reasonOption
      },
      "add targets to the queue"
    ),
    plain(
      "search",
      ["targets", "search"],
      {
        source: sourceOption,
        status: described("status", "only targets in this status"),
        prefix: described("prefix", "only identities starting with this"),
        "changed-since": described("changed-since", "only targets changed since (ISO or epoch ms)"),
        after: described("after", "the `next` of the previous page"),
        limit: limitOption
      },
      "search targets; pages in id order"
    ),
    plain("inspect", ["targets", "inspect"], { source: sourceOption, identity: identityOption, limit: limitOption }, "every lifecycle field of one target and its assignments"),
    plain(
      "requeue",
      ["targets", "requeue"],
      { source: sourceOption, identity: identityOption, status: described("status", "failed or unresolved: every such target of the source"), reason: reasonOption },
      "return a target (or every failed/unresolved one of a source) to pending with fresh budgets"
    ),
    plain(
      "priority",
      ["targets", "priority"],
      { source: sourceOption, identity: identityOption, priority: described("priority", "an integer from -100 to 100 (0 is the default); claims take higher ones first, bounded"), reason: reasonOption },
      "set the claim priority of a target"
    )
  ])
)

const assignments = Command.make("assignments").pipe(
  Command.withDescription("act on assignments"),
  Command.withSubcommands([withArg("cancel", ["assignments", "cancel"], "ID", { reason: reasonOption }, "end a reservation at once; its target returns to pending")])
)

const sources = Command.make("sources").pipe(
  Command.withDescription("pause and resume sources"),
  Command.withSubcommands([
    plain("list", ["sources", "list"], {}, "each source, paused or not, by whom and why"),
    withArg("pause", ["sources", "pause"], "SOURCE", { reason: reasonOption }, "stop claims and discovery of a source on every instance"),
    withArg("resume", ["sources", "resume"], "SOURCE", { reason: reasonOption }, "resume a paused source")
  ])
)

const devices = Command.make("devices").pipe(
  Command.withDescription("list, limit and revoke devices"),
  Command.withSubcommands([
    plain("list", ["devices", "list"], {}, "each device with its slots, sources, active reservations and last contact"),
    withArg("only", ["devices", "only"], "ID", { sources: described("sources", "S,S (a list), all, or none"), reason: reasonOption }, "limit the sources a device is given"),
    withArg("revoke", ["devices", "revoke"], "ID", { reason: reasonOption }, "revoke a device: its token stops working, its reservations end")
  ])
)

const audit = plain("audit", ["audit"], { limit: limitOption, before: described("before", "entries before this id") }, "the audit log, newest first")

/** The operator subcommands of `scanfleet-server`. */
export const commands = [targets, assignments, sources, devices, audit] as const
