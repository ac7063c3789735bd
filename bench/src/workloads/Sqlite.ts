/** Workload 7 (placeholder until written). */
import type { Ctx } from "../Context.js"
import type { WorkloadResult } from "../Report.js"

export const all = async (_ctx: Ctx): Promise<Array<WorkloadResult>> => []
