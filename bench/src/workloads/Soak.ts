/** Workload 3: soak (placeholder until written). */
import type { Ctx } from "../Context.js"
import type { WorkloadResult } from "../Report.js"

export const soak = async (_ctx: Ctx): Promise<Array<WorkloadResult>> => []
