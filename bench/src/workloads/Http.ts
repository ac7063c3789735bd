/** Workload 8: through the Worker API over HTTP (placeholder until written). */
import type { Ctx } from "../Context.js"
import type { WorkloadResult } from "../Report.js"

export const api = async (_ctx: Ctx): Promise<Array<WorkloadResult>> => []
