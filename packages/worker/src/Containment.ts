import { Data, Effect } from "effect"
import { spawn, spawnSync } from "node:child_process"
import { randomUUID } from "node:crypto"
import { existsSync, mkdirSync, readdirSync, readFileSync, readlinkSync, rmdirSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { z } from "zod"
import * as DeviceClock from "./DeviceClock.js"
import * as ProcessTree from "./ProcessTree.js"

/**
 * How a device keeps everything a scan stage starts inside one box the kernel
 * can empty at once. The execution unit and every process it starts (the
 * scanner, its forks, `setsid` children, double-forked daemons) are members
 * of the box; at the target-scan deadline, on a device stop, and when the
 * scanner has exited and its result is staged, the box is emptied, so
 * nothing outlives its scan stage. The level is chosen once, when the device
 * starts: the strongest one the device allows, or the one forced by the
 * `containment` option or the `SCANFLEET_CONTAINMENT` environment variable.
 */

/** Containment levels, strongest first. */
export const levels = ["pid-namespace", "cgroup-v2", "cgroup-v1-freezer", "freeze-kill"] as const
/** A containment level. */
export type Level = (typeof levels)[number]
/** A containment level at a boundary (options, environment, registration). */
export const LevelSchema = z.enum(levels)

/** What each level guarantees, one line each (shown by `status` and in the docs). */
export const guarantees: { readonly [L in Level]: string } = {
  "pid-namespace":
    "the unit is pid 1 of its own PID namespace: killing it makes the kernel kill every process in the namespace, and no process can leave it",
  "cgroup-v2":
    "the unit runs in its own cgroup: cgroup.kill makes the kernel kill every member at once, forks included; only a privileged process could move itself out",
  "cgroup-v1-freezer":
    "the unit runs in its own freezer cgroup: it is frozen (no member can fork), every member is killed, then thawed; only a privileged process could move itself out",
  "freeze-kill":
    "best effort without kernel help: every process of the unit's session, group, descendants or environment tag is stopped until no new one appears, then killed; a process that leaves all four escapes"
}

/** The environment variable that forces a level (`pid-namespace`, `cgroup-v2`, `cgroup-v1-freezer`, `freeze-kill`). */
export const envVar = "SCANFLEET_CONTAINMENT"

/** Environment variables set on the unit (and so inherited by everything it starts). */
export const unitEnv = {
  /** A random tag per unit: the fallback level finds the unit's processes by it. */
  tag: "SCANFLEET_UNIT_TAG",
  /** The unit's containment level. */
  level: "SCANFLEET_UNIT_CONTAINMENT",
  /** The unit's cgroup directory (cgroup levels). */
  cgroup: "SCANFLEET_UNIT_CGROUP"
} as const

/** A forced level that is unknown or that this device does not allow. */
export class ContainmentError extends Data.TaggedError("ContainmentError")<{
  readonly reason: "unknown_level" | "unavailable"
  readonly level: string
  readonly message: string
}> {}

/** What a device can do and what it will use. */
export interface Plan {
  /** The level in force. */
  readonly level: Level
  /** True when the level was forced (option or environment) rather than detected. */
  readonly forced: boolean
  /** Every level this device allows, strongest first. */
  readonly available: ReadonlyArray<Level>
  /** The `unshare` arguments that make a PID namespace (pid-namespace level). */
  readonly unshareArgs: ReadonlyArray<string>
  /** The cgroup directory per-unit cgroups are made under (cgroup levels). */
  readonly cgroupDir: string | null
  /** The cgroup directory of each cgroup level the device allows, so another level can be chosen without probing again. */
  readonly cgroupDirs: { readonly "cgroup-v2": string | null; readonly "cgroup-v1-freezer": string | null }
  /** One line for humans: the level, what it guarantees, and how to get a stronger one. */
  readonly detail: string
}

/** Detection options. */
export interface DetectOptions {
  /** Forces a level (overrides `SCANFLEET_CONTAINMENT`). */
  readonly force?: string | undefined
  /** The environment to read `SCANFLEET_CONTAINMENT` from (default `process.env`). */
  readonly env?: Record<string, string | undefined>
}

const isLinux = process.platform === "linux"

const mountinfo = (): ReadonlyArray<{ readonly mount: string; readonly fstype: string; readonly superOptions: string }> => {
  try {
    return readFileSync("/proc/self/mountinfo", "utf8")
      .split("\n")
      .filter((l) => l.includes(" - "))
      .map((l) => {
        const [left, right] = l.split(" - ")
        const [fstype, , superOptions] = right.split(" ")
        return { mount: left.split(" ")[4].replace(/\\040/g, " "), fstype, superOptions: superOptions ?? "" }
      })
  } catch {
    return []
  }
}

/** This process's own cgroup path in a hierarchy (`0::/x` for v2, `N:freezer:/x` for v1). */
const ownCgroup = (controller: string | null): string | null => {
  try {
    for (const line of readFileSync("/proc/self/cgroup", "utf8").split("\n")) {
      const [, ctrls, path] = line.split(/:(.*?):/)
      if (path === undefined) continue
      if (controller === null ? ctrls === "" : ctrls.split(",").includes(controller)) return path
    }
  } catch {
    // no /proc: no cgroup
  }
  return null
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms))

/** Waits (bounded) until a condition holds; never blocks the event loop, which supervises other units meanwhile. */
const waitFor = async (ms: number, ok: () => boolean, every = 5): Promise<boolean> => {
  const until = DeviceClock.monotonicMs() + ms
  while (!ok()) {
    if (DeviceClock.monotonicMs() >= until) return false
    await sleep(every)
  }
  return true
}

const readText = (file: string): string => {
  try {
    return readFileSync(file, "utf8")
  } catch {
    return ""
  }
}

const pidsIn = (dir: string): ReadonlyArray<number> =>
  readText(join(dir, "cgroup.procs"))
    .split("\n")
    .filter((l) => l !== "")
    .map(Number)

/** The arguments of `unshare` that give a process its own PID namespace, or null when the device does not allow it. */
const probePidNamespace = (): ReadonlyArray<string> | null => {
  if (!isLinux) return null
  const base = ["--pid", "--fork", "--kill-child"]
  const candidates = process.getuid?.() === 0 ? [base] : [["--user", "--map-root-user", ...base]]
  for (const args of candidates) {
    const r = spawnSync("unshare", [...args, "true"], { stdio: "ignore", timeout: 5000 })
    if (r.status === 0) return args
  }
  return null
}

/**
 * Proves a cgroup directory works for units: a real process is moved into a
 * probe cgroup under it and killed the way units are, then the probe is removed.
 */
const probeCgroup = async (dir: string, version: 2 | 1): Promise<boolean> => {
  if (!existsSync(join(dir, ".."))) return false
  const probe = join(dir, `scanfleet-probe-${process.pid}-${randomUUID().slice(0, 8)}`)
  let child: ReturnType<typeof spawn> | null = null
  try {
    mkdirSync(probe, { recursive: true })
    if (version === 2 && !existsSync(join(probe, "cgroup.kill"))) return false
    if (version === 1 && !existsSync(join(probe, "freezer.state"))) return false
    child = spawn("sleep", ["30"], { stdio: "ignore", detached: true })
    if (child.pid === undefined) return false
    writeFileSync(join(probe, "cgroup.procs"), String(child.pid))
    if (!pidsIn(probe).includes(child.pid)) return false
    if (version === 2) killCgroupV2(probe)
    else await killCgroupV1(probe, new Set())
    return await waitFor(2000, () => pidsIn(probe).length === 0)
  } catch {
    return false
  } finally {
    try {
      if (child?.pid !== undefined) process.kill(child.pid, "SIGKILL")
    } catch {
      // gone, as it should be
    }
    child?.unref()
    await removeCgroup(probe)
  }
}

/** The directory per-unit cgroups go under, for v2 (`cgroup.kill`) or the v1 freezer. */
const cgroupBase = (version: 2 | 1): string | null => {
  if (!isLinux) return null
  const m = mountinfo().find((m) => (version === 2 ? m.fstype === "cgroup2" : m.fstype === "cgroup" && m.superOptions.split(",").includes("freezer")))
  if (!m) return null
  const own = ownCgroup(version === 2 ? null : "freezer")
  if (own === null) return null
  return join(m.mount, own, "scanfleet")
}

const describe = (level: Level, available: ReadonlyArray<Level>): string => {
  const stronger = levels.slice(0, levels.indexOf(level)).filter((l) => !available.includes(l))
  const hint =
    stronger.length === 0
      ? ""
      : "; stronger: " +
        stronger
          .map((l) =>
            l === "pid-namespace"
              ? "pid-namespace (run as root, or allow unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0)"
              : l === "cgroup-v2"
                ? "cgroup-v2 (a writable cgroup v2 subtree with cgroup.kill, Linux ≥ 5.14: root, or systemd Delegate=yes)"
                : "cgroup-v1-freezer (a writable freezer hierarchy: root)"
          )
          .join("; ")
  return `${level}: ${guarantees[level]}${hint}`
}

/**
 * Finds which containment levels the device allows, by trying each for real
 * (a PID namespace is made, a process is put in a cgroup and killed there),
 * and picks the strongest, or the forced one. Forcing a level the device
 * does not allow fails, naming what is available.
 */
export const detect = (opts: DetectOptions = {}): Effect.Effect<Plan, ContainmentError> =>
  Effect.gen(function* () {
    const raw = opts.force ?? (opts.env ?? process.env)[envVar]
    const wanted = raw === undefined || raw === "" ? null : raw
    if (wanted !== null && !LevelSchema.safeParse(wanted).success)
      return yield* new ContainmentError({ reason: "unknown_level", level: wanted, message: `unknown containment level "${wanted}"; expected one of ${levels.join(", ")}` })
    const unshareArgs = yield* Effect.sync(probePidNamespace)
    const v2 = yield* Effect.promise(async () => {
      const dir = cgroupBase(2)
      return dir !== null && (await probeCgroup(dir, 2)) ? dir : null
    })
    const v1 = yield* Effect.promise(async () => {
      const dir = cgroupBase(1)
      return dir !== null && (await probeCgroup(dir, 1)) ? dir : null
    })
    const available: Array<Level> = []
    if (unshareArgs !== null) available.push("pid-namespace")
    if (v2 !== null) available.push("cgroup-v2")
    if (v1 !== null) available.push("cgroup-v1-freezer")
    available.push("freeze-kill")
    const all: Plan = {
      level: available[0],
      forced: false,
      available,
      unshareArgs: unshareArgs ?? [],
      cgroupDir: available[0] === "cgroup-v2" ? v2 : available[0] === "cgroup-v1-freezer" ? v1 : null,
      cgroupDirs: { "cgroup-v2": v2, "cgroup-v1-freezer": v1 },
      detail: describe(available[0], available)
    }
    return wanted === null ? all : yield* withLevel(all, wanted as Level)
  })

/** The plan for one level, from a detected plan (tests and benchmarks run every level a device has); fails when the device does not allow it. */
export const withLevel = (plan: Plan, level: Level): Effect.Effect<Plan, ContainmentError> =>
  plan.available.includes(level)
    ? Effect.succeed({
        ...plan,
        level,
        forced: true,
        cgroupDir: level === "cgroup-v2" || level === "cgroup-v1-freezer" ? plan.cgroupDirs[level] : null,
        detail: describe(level, plan.available)
      })
    : Effect.fail(
        new ContainmentError({ reason: "unavailable", level, message: `containment level ${level} is not available on this device (available: ${plan.available.join(", ")})` })
      )

// ---------------------------------------------------------------------------
// Killing, per level. The same functions serve the controller (deadline,
// stop, scanner done) and the unit itself (its controller vanished).

const signal = (pid: number, sig: NodeJS.Signals): boolean => {
  try {
    process.kill(pid, sig)
    return true
  } catch {
    return false
  }
}

/** cgroup v2: the kernel kills every member, forks racing with it included. */
const killCgroupV2 = (dir: string): void => {
  try {
    writeFileSync(join(dir, "cgroup.kill"), "1")
  } catch {
    // already removed: nothing left to kill
  }
}

/** cgroup v1 freezer: freeze (no member can fork any more), kill every member, thaw so the kills land. */
const killCgroupV1 = async (dir: string, spare: ReadonlySet<number>): Promise<void> => {
  const state = join(dir, "freezer.state")
  try {
    if (spare.size === 0) {
      writeFileSync(state, "FROZEN")
      await waitFor(1000, () => readText(state).trim() === "FROZEN")
      for (const pid of pidsIn(dir)) signal(pid, "SIGKILL")
      writeFileSync(state, "THAWED")
    } else {
      // The unit cannot freeze its own cgroup and go on: it kills the others until none is left.
      await waitFor(1000, () => {
        const others = pidsIn(dir).filter((p) => !spare.has(p))
        for (const pid of others) signal(pid, "SIGKILL")
        return others.length === 0
      })
    }
  } catch {
    // already removed: nothing left to kill
  }
}

/** Removes a cgroup once it is empty (bounded wait); a cgroup that stays busy is left for the next start. */
const removeCgroup = async (dir: string): Promise<void> => {
  await waitFor(1000, () => {
    try {
      rmdirSync(dir)
      return true
    } catch (e) {
      return (e as NodeJS.ErrnoException).code === "ENOENT"
    }
  })
}

const environHas = (pid: number, entry: string): boolean => {
  try {
    return readFileSync(`/proc/${pid}/environ`, "latin1").split("\0").includes(entry)
  } catch {
    return false
  }
}

/**
 * The fallback's view of a unit: every live process in the unit's session or
 * group, a descendant of the unit, or carrying its tag in its environment.
 * Only processes started no earlier than the unit can be any of these, so
 * only theirs are read (environments are the expensive part).
 */
const tagged = (unitPid: number, tag: string, since: number): ReadonlyArray<number> => {
  const procs = ProcessTree.all().filter((p) => p.state !== "Z" && p.state !== "X" && (p.pid === unitPid || Number(p.startTime) >= since))
  const found = new Set<number>()
  const children = new Map<number, Array<number>>()
  for (const p of procs) {
    const list = children.get(p.ppid) ?? []
    list.push(p.pid)
    children.set(p.ppid, list)
    if (p.sid === unitPid || p.pgid === unitPid || p.pid === unitPid) found.add(p.pid)
  }
  const queue = [unitPid]
  while (queue.length > 0) for (const c of children.get(queue.shift()!) ?? []) if (!found.has(c)) (found.add(c), queue.push(c))
  const entry = `${unitEnv.tag}=${tag}`
  for (const p of procs) if (!found.has(p.pid) && environHas(p.pid, entry)) found.add(p.pid)
  return [...found]
}

/** A process's start time in clock ticks since boot (0 when unknown, which makes every process a candidate). */
const startTicks = (pid: number): number => Number(ProcessTree.stat(pid)?.startTime ?? 0) || 0

/**
 * Freeze-then-kill: SIGSTOP every member found, look again until a look finds
 * no new one (a stopped process cannot fork), then SIGKILL them all.
 */
const freezeKill = async (find: () => ReadonlyArray<number>, spare: ReadonlySet<number>): Promise<void> => {
  const stopped = new Set<number>()
  for (let round = 0; round < 200; round++) {
    const fresh = find().filter((p) => !spare.has(p) && !stopped.has(p))
    if (fresh.length === 0) break
    for (const pid of fresh) if (signal(pid, "SIGSTOP")) stopped.add(pid)
    // A fork in flight when SIGSTOP landed shows up in the next look.
    await waitFor(50, () => fresh.every((p) => { const s = ProcessTree.stat(p)?.state; return s === undefined || s === "T" || s === "Z" || s === "X" }))
  }
  for (const pid of stopped) signal(pid, "SIGKILL")
  for (const pid of find()) if (!spare.has(pid)) signal(pid, "SIGKILL")
}

/** The pid namespace a process is in (the link of /proc/<pid>/ns/pid), or null when it is gone. */
const pidNamespace = (pid: number): string | null => {
  try {
    return readlinkSync(`/proc/${pid}/ns/pid`)
  } catch {
    return null
  }
}

const inNamespace = (ns: string): ReadonlyArray<number> => {
  const out: Array<number> = []
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue
    const pid = Number(name)
    if (pidNamespace(pid) !== ns) continue
    const s = ProcessTree.stat(pid)
    if (s !== null && s.state !== "Z" && s.state !== "X") out.push(pid)
  }
  return out
}

/** How the controller starts a unit under a level. */
export interface Launch {
  readonly command: string
  readonly args: ReadonlyArray<string>
  readonly env: Record<string, string>
}

/**
 * One unit's box, as the controller holds it. Made before the unit starts
 * (`launch` says how to start it), bound to the unit once it is running and
 * before it starts anything (`attach`), emptied by `kill`, removed by `release`.
 */
export interface Seal {
  readonly level: Level
  /** The unit's environment tag. */
  readonly tag: string
  /** The unit's cgroup directory (cgroup levels; null otherwise). */
  readonly cgroup: string | null
  /** The command line that starts the unit script under this level. */
  readonly launch: (node: string, script: string) => Launch
  /** Records the launcher's pid (the process the controller spawned), before the unit is attached. */
  readonly launched: (pid: number) => void
  /** The unit's pid as this process sees it (0 until attached). */
  readonly unitPid: () => number
  /** Binds the box to the running unit (its pid as this process sees it; the launcher's pid). Puts it in its cgroup. */
  readonly attach: (unit: { readonly unitPid: number; readonly launcherPid: number }) => void
  /** Every live member, the unit and its launcher included (pids as this process sees them). */
  readonly members: () => ReadonlyArray<number>
  /** Sends a signal to every member but the unit and its launcher; returns how many got it. */
  readonly signalOthers: (sig: NodeJS.Signals) => number
  /** Kills every member with the level's means, then waits (bounded) until none is alive; returns the survivors. */
  readonly kill: (waitMs: number) => Promise<ReadonlyArray<number>>
  /** Removes the unit's cgroup (after `kill`). */
  readonly release: () => Promise<void>
}

/** Makes the box for one unit under a plan. */
export const seal = (plan: Plan): Seal => {
  const tag = randomUUID()
  const level = plan.level
  const cgroup = plan.cgroupDir === null ? null : join(plan.cgroupDir, `u${process.pid}-${tag.slice(0, 8)}`)
  let unitPid = 0
  let unitStart = 0
  let launcherPid = 0
  let ns: string | null = null

  const members = (): ReadonlyArray<number> => {
    if (unitPid === 0) return launcherPid === 0 ? [] : ProcessTree.members(launcherPid)
    const launcher = launcherPid !== unitPid && ProcessTree.isAlive(launcherPid) ? [launcherPid] : []
    switch (level) {
      case "pid-namespace":
        return ns === null ? launcher : [...launcher, ...inNamespace(ns)]
      case "cgroup-v2":
      case "cgroup-v1-freezer":
        return [...launcher, ...pidsIn(cgroup!).filter((p) => ProcessTree.isAlive(p))]
      case "freeze-kill":
        return tagged(unitPid, tag, unitStart)
    }
  }

  return {
    level,
    tag,
    cgroup,
    launch: (node, script) => {
      const env: Record<string, string> = { [unitEnv.tag]: tag, [unitEnv.level]: level }
      if (cgroup !== null) env[unitEnv.cgroup] = cgroup
      if (level === "pid-namespace") return { command: "unshare", args: [...plan.unshareArgs, node, script], env }
      return { command: node, args: [script], env }
    },
    launched: (pid) => {
      launcherPid = pid
    },
    unitPid: () => unitPid,
    attach: (u) => {
      unitPid = u.unitPid
      unitStart = startTicks(u.unitPid)
      launcherPid = u.launcherPid
      if (level === "pid-namespace") ns = pidNamespace(u.unitPid)
      if (cgroup !== null) {
        mkdirSync(cgroup, { recursive: true })
        writeFileSync(join(cgroup, "cgroup.procs"), String(u.unitPid))
      }
    },
    members,
    signalOthers: (sig) => {
      let n = 0
      for (const pid of members()) if (pid !== unitPid && pid !== launcherPid && signal(pid, sig)) n++
      return n
    },
    kill: async (waitMs) => {
      if (unitPid === 0) {
        // Not attached yet: the unit has started nothing, its group is all there is.
        if (launcherPid !== 0) ProcessTree.signalGroup(launcherPid, "SIGKILL")
      } else
        switch (level) {
          case "pid-namespace":
            // The namespace's pid 1 dies, and the kernel kills everything else in it (a pid that is no longer the unit is left alone).
            if (startTicks(unitPid) === unitStart) signal(unitPid, "SIGKILL")
            break
          case "cgroup-v2":
            killCgroupV2(cgroup!)
            break
          case "cgroup-v1-freezer":
            await killCgroupV1(cgroup!, new Set())
            break
          case "freeze-kill":
            await freezeKill(() => tagged(unitPid, tag, unitStart), new Set([process.pid]))
            break
        }
      if (launcherPid !== 0) signal(launcherPid, "SIGKILL")
      const until = DeviceClock.monotonicMs() + waitMs
      let left = members()
      while (left.length > 0 && DeviceClock.monotonicMs() < until) {
        // A member that appeared after the kill (the fallback's race) is killed on sight.
        if (level === "freeze-kill") for (const p of left) signal(p, "SIGKILL")
        await sleep(20)
        left = members()
      }
      return left
    },
    release: async () => {
      if (cgroup !== null) await removeCgroup(cgroup)
    }
  }
}

/**
 * Empties and removes the unit cgroups a dead controller left behind (unit
 * cgroups are named after their controller's pid: `u<pid>-<tag>`). A unit
 * empties its own cgroup when its controller dies; this catches the case
 * where the unit died with it, or could not act (a scanner stopped it).
 * Returns the processes killed, by cgroup directory.
 */
export const reclaim = (plan: Plan): Effect.Effect<ReadonlyMap<string, ReadonlyArray<number>>> =>
  Effect.promise(async () => {
    const killed = new Map<string, ReadonlyArray<number>>()
    for (const level of ["cgroup-v2", "cgroup-v1-freezer"] as const) {
      const base = plan.cgroupDirs[level]
      if (base === null) continue
      let names: Array<string> = []
      try {
        names = readdirSync(base)
      } catch {
        continue
      }
      for (const name of names) {
        const m = /^u(\d+)-[0-9a-f]{8}$/.exec(name)
        if (m === null || Number(m[1]) === process.pid || ProcessTree.isAlive(Number(m[1]))) continue
        const dir = join(base, name)
        killed.set(dir, pidsIn(dir))
        if (level === "cgroup-v2") killCgroupV2(dir)
        else await killCgroupV1(dir, new Set())
        await removeCgroup(dir)
      }
    }
    return killed
  })

/**
 * Called by the unit when its controller is gone: empties the unit's box
 * (the unit itself included), so a crashed controller leaves nothing behind.
 */
export const killFromInside = async (env: Record<string, string | undefined> = process.env): Promise<never> => {
  const level = LevelSchema.safeParse(env[unitEnv.level])
  const cgroup = env[unitEnv.cgroup]
  const tag = env[unitEnv.tag]
  const self = new Set([process.pid])
  if (level.success && level.data === "cgroup-v2" && cgroup) killCgroupV2(cgroup)
  else if (level.success && level.data === "cgroup-v1-freezer" && cgroup) await killCgroupV1(cgroup, self)
  else if (level.success && level.data === "freeze-kill" && tag) await freezeKill(() => tagged(process.pid, tag, startTicks(process.pid)), self)
  // In a PID namespace the unit is pid 1: its exit takes the namespace down.
  process.exit(1)
}
