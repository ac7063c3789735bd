import { PhaseModel, Source, WorkerApi } from "@scanfleet/core"
import { Data, Either } from "effect"
import { open, stat } from "node:fs/promises"
import { z } from "zod"
import * as Damage from "./internal/Damage.js"
import * as Scanner from "./Scanner.js"

/**
 * The one description of what the controller and an execution unit say to
 * each other over the unit's IPC channel, and of the limits the unit holds a
 * scanner's output to. Both sides parse every message with these schemas.
 */

/**
 * Limits on what a scan stage may hand to its result. Findings and the log
 * are capped where they are produced (the unit), so neither the unit nor the
 * controller ever holds more than this, whatever the scanner prints.
 */
export const OutputLimitsSchema = z
  .object({
    /** Most findings kept (the result's own limit). */
    maxFindings: z.number().int().min(0).max(WorkerApi.maxFindings).default(WorkerApi.maxFindings),
    /** Bytes of findings kept: the result size limit less room for the log and the envelope. */
    maxFindingsBytes: z.number().int().min(0).max(WorkerApi.maxResultBytes).default(WorkerApi.maxResultBytes - 70_000),
    /** Longest stdout line parsed; a longer one is dropped unread (it could not fit a result anyway). */
    maxLineBytes: z.number().int().min(1).max(WorkerApi.maxResultBytes).default(WorkerApi.maxResultBytes - 70_000),
    /** Bytes of stdout kept in the unit's work folder (`scanner.stdout`); the rest is counted, not stored. */
    maxStdoutFileBytes: z.number().int().min(0).default(64 * 1024 * 1024),
    /** Characters of log kept (the tail: the end of a log says why a scan stopped), notes on what was cut included. */
    maxLogChars: z.number().int().min(1000).max(WorkerApi.maxLogChars).default(60_000),
    /** How long the unit drains a scanner's pipes after the scanner exited, milliseconds. */
    drainMs: z.number().int().min(0).max(10_000).default(500)
  })
  .strict()
/** Output limits as written by a user (every field optional). */
export type OutputLimitsInput = z.input<typeof OutputLimitsSchema>
/** Output limits with defaults filled in. */
export type OutputLimits = z.output<typeof OutputLimitsSchema>
/** The default limits. */
export const defaultLimits: OutputLimits = OutputLimitsSchema.parse({})

/** What one assignment's unit is told to do. */
export const JobSchema = z
  .object({
    reservationId: z.number().int(),
    target: z.object({ id: z.number().int(), source: Source.SourceSchema, identity: z.string() }).strict(),
    workDir: z.string().min(1),
    stageFile: z.string().min(1),
    scanner: Scanner.SpecSchema,
    /** The scanner's expanded arguments (command scanners). */
    args: z.array(z.string()),
    acquireArgs: z.array(z.string()),
    /** Target-scan deadline on the device's clock, for the runner's information. */
    scanDeadline: z.number(),
    /** The device clock's anchor (see `DeviceClock`): the unit stamps phases and its stage file on the controller's clock. */
    clockAnchorMs: z.number().optional(),
    limits: OutputLimitsSchema.default(() => ({ ...defaultLimits }))
  })
  .strict()
/** A job as the unit holds it. */
export type Job = z.output<typeof JobSchema>

/** Controller → unit. */
export const ToUnit = z.discriminatedUnion("t", [
  z.object({ t: z.literal("start"), job: JobSchema }).strict(),
  z.object({ t: z.literal("permit") }).strict()
])
/** A message to a unit. */
export type ToUnit = z.input<typeof ToUnit>

/** Unit → controller. */
export const ToController = z.discriminatedUnion("t", [
  /** The unit runs and has started nothing yet; `hostPid` is its pid as the controller sees it (it differs inside a PID namespace). */
  z.object({ t: z.literal("ready"), hostPid: z.number().int().min(1) }).strict(),
  z.object({ t: z.literal("phase"), phase: z.enum(PhaseModel.scanStage), at: z.number() }).strict(),
  z.object({ t: z.literal("permit_request") }).strict(),
  z.object({ t: z.literal("scanner"), pid: z.number().int().optional() }).strict(),
  /** A runner module's `ctx.log` line, so it survives a unit killed at its deadline. */
  z.object({ t: z.literal("log"), text: z.string().max(4096) }).strict(),
  z.object({ t: z.literal("staged"), at: z.number(), peakRssKiB: z.number().int().min(0).nullable() }).strict(),
  z.object({ t: z.literal("failed"), message: z.string().max(8000), at: z.number() }).strict()
])
/** A message from a unit. */
export type ToController = z.infer<typeof ToController>

/** The stage file as the unit writes it: the result and when the unit staged it (device clock, epoch milliseconds). */
export const StageFileSchema = z.object({ stagedAt: z.number(), staged: Scanner.StagedSchema }).strict()
/** A stage file's content. */
export type StageFile = z.infer<typeof StageFileSchema>

/**
 * Whether a stage file is the scan's result: only what was staged before the
 * target-scan deadline is. The scan stage has one hard deadline, and a
 * scanner that exits cleanly on the deadline's SIGTERM ("nothing found") must
 * not turn a timeout into a completed scan.
 */
export const stagedInTime = (file: StageFile, scanDeadline: number): boolean => file.stagedAt < scanDeadline

/**
 * A stage file that holds something else than a staged result: cut short,
 * overwritten, or larger than a unit writes. The message never quotes it (the
 * findings in it are not redacted yet).
 */
export class StageDamaged extends Data.TaggedError("StageDamaged")<{ readonly file: string; readonly message: string }> {}

/**
 * Reads a stage file without trusting its size: a file larger than any
 * result the unit can write (its limits bound it) is refused unread. What
 * does not parse is a `StageDamaged`; failing to read it at all (it is gone,
 * or unreadable) is the file system's own error.
 */
export const readStaged = async (file: string, limits: OutputLimits = defaultLimits): Promise<StageFile> => {
  const bound = limits.maxFindingsBytes + limits.maxLogChars * 4 + 64 * 1024
  const size = (await stat(file)).size
  if (size > bound) throw new StageDamaged({ file, message: `it is ${size} bytes, more than the ${bound} a unit writes` })
  const fh = await open(file, "r")
  try {
    const buf = Buffer.alloc(size)
    await fh.read(buf, 0, size, 0)
    const doc = Damage.decode(z.unknown(), buf.toString("utf8"))
    if (Either.isLeft(doc)) throw new StageDamaged({ file, message: doc.left })
    // Written by a build before the stage file said when it was staged: a bare result, staged when the file was written.
    const bare = Scanner.StagedSchema.safeParse(doc.right)
    if (bare.success) return { stagedAt: Math.floor((await fh.stat()).mtimeMs), staged: bare.data }
    const staged = Damage.check(StageFileSchema, doc.right)
    if (Either.isLeft(staged)) throw new StageDamaged({ file, message: staged.left })
    return staged.right
  } finally {
    await fh.close()
  }
}

/**
 * The schemas that share their name with a type, under a second name: the
 * bundled `.d.ts` keeps only the type of such a pair, so code built against
 * the published package refers to the schema by this one.
 */
export const ToUnitSchema = ToUnit
/** See `ToUnitSchema`. */
export const ToControllerSchema = ToController
