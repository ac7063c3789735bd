/** Samples, medians, spreads, ratios, and the printed tables. */

/** One measured run of one system. */
export interface Sample {
  /** The workload's figure for this run (throughput or latency, see the workload's unit). */
  readonly value: number
  /** Client round trips (top-level statements) per unit of work, when measured. */
  readonly statementsPerUnit?: number
  /** Secondary figures of the run (named). */
  readonly extra?: Readonly<Record<string, number | string>>
  /** CPU per unit of work, µs: this client process and the whole PostgreSQL server, when measured. */
  readonly cpu?: { readonly clientMicros: number; readonly serverMicros: number }
  /** WAL written per unit of work, bytes, when measured. */
  readonly walPerUnit?: number
  /** The heaviest statements of the measured section, per unit of work (written to the JSON only). */
  readonly profile?: ReadonlyArray<{ readonly callsPerUnit: number; readonly ms: number; readonly query: string }>
}

/** One system's runs within a workload. */
export interface SystemResult {
  readonly system: string
  readonly samples: ReadonlyArray<Sample>
  readonly errors: ReadonlyArray<string>
  readonly note?: string
}

/** A workload's table. */
export interface WorkloadResult {
  readonly id: string
  readonly title: string
  readonly goal: string
  readonly unit: string
  /** Throughputs are better higher; latencies lower. The ratio column is always a speed ratio. */
  readonly higherIsBetter: boolean
  /** No ratio column (the figure is not a speed). */
  readonly noRatio?: boolean
  readonly systems: ReadonlyArray<SystemResult>
  readonly notes: ReadonlyArray<string>
}

/** A system taking part in a workload: one call is one measured run. */
export interface Contender {
  readonly name: string
  readonly note?: string
  readonly run: (run: number) => Promise<Sample>
}

export const median = (xs: ReadonlyArray<number>): number => {
  if (xs.length === 0) return NaN
  const s = [...xs].sort((a, b) => a - b)
  const m = s.length >> 1
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2
}

/**
 * Runs every contender `runs` times, interleaved (A B C A B C ...), so that a
 * burst of noise on the shared machine hits every system alike.
 */
export const measure = async (contenders: ReadonlyArray<Contender>, runs: number, log: (s: string) => void): Promise<Array<SystemResult>> => {
  const acc = contenders.map((c) => ({ system: c.name, note: c.note, samples: [] as Array<Sample>, errors: [] as Array<string> }))
  for (let r = 0; r < runs; r++) {
    for (let i = 0; i < contenders.length; i++) {
      const c = contenders[i]
      if (acc[i].errors.length > 0) continue // a system that failed once is not retried
      const t0 = Date.now()
      try {
        const s = await c.run(r)
        acc[i].samples.push(s)
        log(`    ${c.name} run ${r + 1}: ${fmt(s.value)}${s.statementsPerUnit !== undefined ? `, ${fmt(s.statementsPerUnit)} stmt/unit` : ""} (${((Date.now() - t0) / 1000).toFixed(1)} s)`)
      } catch (e) {
        const msg = e instanceof Error ? `${e.message}` : String(e)
        if (process.env.BENCH_TRACE) log(`      ${(e as Error)?.stack ?? e} ${JSON.stringify(e)}`)
        acc[i].errors.push(msg)
        log(`    ${c.name} run ${r + 1}: FAILED ${msg.split("\n")[0]}`)
      }
    }
  }
  return acc
}

export const fmt = (x: number | undefined): string => {
  if (x === undefined || Number.isNaN(x)) return "-"
  const a = Math.abs(x)
  if (a >= 1000) return Math.round(x).toLocaleString("en-US")
  if (a >= 100) return x.toFixed(0)
  if (a >= 10) return x.toFixed(1)
  if (a >= 1) return x.toFixed(2)
  return x.toFixed(3)
}

const pad = (s: string, n: number, right = false) => (right ? s.padStart(n) : s.padEnd(n))

/** The speed ratio of scanfleet over an alternative (>1: scanfleet is faster). */
export const speedRatio = (w: WorkloadResult, sf: number, alt: number) => (w.higherIsBetter ? sf / alt : alt / sf)

const ratioText = (r: number) => `${r >= 0.1 ? r.toFixed(2) : r.toPrecision(2)}x`

/** Renders one workload as a plain-text table (also valid Markdown). */
export const table = (w: WorkloadResult): string => {
  const sf = w.systems.find((s) => s.system.startsWith("scanfleet"))
  const sfMed = sf ? median(sf.samples.map((s) => s.value)) : NaN
  // The cost columns appear when a workload measures them: CPU µs and WAL bytes per unit of work.
  const costs = w.systems.some((s) => s.samples.some((x) => x.cpu !== undefined || x.walPerUnit !== undefined))
  const header = ["system", `median ${w.unit}`, "spread (min..max)", "runs", "stmts/unit", ...(costs ? ["client CPU µs/unit", "server CPU µs/unit", "WAL bytes/unit"] : []), "scanfleet speed ratio"]
  const medianOf = (s: SystemResult, f: (x: Sample) => number | undefined) => {
    const xs = s.samples.map(f).filter((x): x is number => x !== undefined)
    return xs.length ? fmt(median(xs)) : "-"
  }
  const rows = w.systems.map((s) => {
    const vs = s.samples.map((x) => x.value)
    const st = s.samples.map((x) => x.statementsPerUnit).filter((x): x is number => x !== undefined)
    const med = median(vs)
    const ratio = w.noRatio || s === sf || !sf || Number.isNaN(sfMed) || Number.isNaN(med) ? "" : ratioText(speedRatio(w, sfMed, med))
    return [
      s.system,
      s.errors.length > 0 && vs.length === 0 ? "FAILED (see below)" : fmt(med),
      vs.length ? `${fmt(Math.min(...vs))}..${fmt(Math.max(...vs))}` : "-",
      String(vs.length),
      st.length ? fmt(median(st)) : "-",
      ...(costs ? [medianOf(s, (x) => x.cpu?.clientMicros), medianOf(s, (x) => x.cpu?.serverMicros), medianOf(s, (x) => x.walPerUnit)] : []),
      ratio
    ]
  })
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)))
  const line = (cells: ReadonlyArray<string>) => `| ${cells.map((c, i) => pad(c, widths[i], i > 0 && i !== 2)).join(" | ")} |`
  const out = [
    `### ${w.id}. ${w.title}`,
    `Goal: ${w.goal}`,
    "",
    line(header),
    `| ${widths.map((n, i) => (i > 0 && i !== 2 ? "-".repeat(n - 1) + ":" : "-".repeat(n))).join(" | ")} |`,
    ...rows.map(line)
  ]
  const extras = w.systems.flatMap((s) => {
    const keys = [...new Set(s.samples.flatMap((x) => Object.keys(x.extra ?? {})))]
    if (keys.length === 0) return []
    return [
      `- ${s.system}: ` +
        keys
          .map((k) => {
            const vals = s.samples.map((x) => x.extra?.[k]).filter((v) => v !== undefined)
            const nums = vals.filter((v): v is number => typeof v === "number")
            return `${k} ${nums.length === vals.length ? fmt(median(nums)) : String(vals[vals.length - 1])}`
          })
          .join(", ")
    ]
  })
  const notes = [
    ...w.systems.filter((s) => s.errors.length > 0).map((s) => `- ${s.system} FAILED: ${s.errors[0].replace(/\s+/g, " ").slice(0, 300)}`),
    ...w.systems.filter((s) => s.note).map((s) => `- ${s.system}: ${s.note}`),
    ...w.notes.map((n) => `- ${n}`)
  ]
  if (extras.length) out.push("", "Secondary figures (medians):", ...extras)
  if (notes.length) out.push("", ...notes)
  return out.join("\n")
}

/**
 * Starts measuring a section's costs: this client process's CPU (user + system), the
 * server's CPU (every PostgreSQL process) and the WAL it wrote. `end(units)` gives
 * them per unit of work. Only one system runs at a time, so the server's figures are
 * that system's (plus the server's own background work, the same for everyone).
 */
export const meter = async (pg: { readonly cpuMicros: () => number; readonly walBytes: () => Promise<bigint> }) => {
  const wal0 = await pg.walBytes()
  const server0 = pg.cpuMicros()
  const client0 = process.cpuUsage()
  return {
    end: async (units: number): Promise<Pick<Sample, "cpu" | "walPerUnit">> => {
      const client = process.cpuUsage(client0)
      const server = pg.cpuMicros() - server0
      const wal = Number((await pg.walBytes()) - wal0)
      const per = Math.max(1, units)
      return { cpu: { clientMicros: (client.user + client.system) / per, serverMicros: server / per }, walPerUnit: wal / per }
    }
  }
}
