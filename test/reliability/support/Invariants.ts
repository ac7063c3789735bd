import { withPg } from "./Procs.js"

/**
 * The queue's invariants, read straight from a PostgreSQL database: every
 * violation found is returned as a sentence (an empty list means all hold).
 */
export const violations = (url: string): Promise<Array<string>> =>
  withPg(url, async (c) => {
    const out: Array<string> = []
    const q = async (text: string) => (await c.query(text)).rows
    for (const r of await q(`SELECT target_id, count(*)::int AS n FROM assignments WHERE state = 'active' GROUP BY target_id HAVING count(*) > 1`))
      out.push(`target ${r.target_id} is claimed ${r.n} times at once`)
    for (const r of await q(`SELECT t.id FROM targets t WHERE t.status = 'in_progress' AND NOT EXISTS (SELECT 1 FROM assignments a WHERE a.target_id = t.id AND a.state = 'active')`))
      out.push(`target ${r.id} is in progress with no active reservation (a lost reservation)`)
    for (const r of await q(`SELECT a.reservation_id, t.status FROM assignments a JOIN targets t ON t.id = a.target_id WHERE a.state = 'active' AND t.status <> 'in_progress'`))
      out.push(`reservation ${r.reservation_id} is active but its target is ${r.status}`)
    for (const r of await q(`SELECT a.reservation_id, a.last_seq, count(e.seq)::int AS n, coalesce(max(e.seq), 0) AS top FROM assignments a LEFT JOIN progress_events e ON e.reservation_id = a.reservation_id GROUP BY a.reservation_id, a.last_seq HAVING count(e.seq) <> coalesce(max(e.seq), 0) OR coalesce(max(e.seq), 0) <> a.last_seq`))
      out.push(`reservation ${r.reservation_id}: ${r.n} events up to seq ${r.top}, last_seq ${r.last_seq} (a gap or a duplicate)`)
    for (const r of await q(`SELECT e1.reservation_id, e1.seq FROM progress_events e1 JOIN progress_events e2 ON e2.reservation_id = e1.reservation_id AND e2.seq = e1.seq + 1 WHERE e2.accepted_at < e1.accepted_at`))
      out.push(`reservation ${r.reservation_id}: event ${r.seq + 1} was accepted before event ${r.seq} (reordered)`)
    // the result body is kept on its reservation
    for (const r of await q(`SELECT a.reservation_id FROM assignments a WHERE a.state = 'completed' AND (a.result_body IS NULL OR a.outcome IS NULL)`))
      out.push(`reservation ${r.reservation_id} is completed without a result`)
    for (const r of await q(`SELECT a.reservation_id, a.state FROM assignments a WHERE a.result_body IS NOT NULL AND a.state NOT IN ('completed', 'failed')`))
      out.push(`reservation ${r.reservation_id} has a result but is ${r.state}`)
    for (const r of await q(`SELECT reservation_id FROM assignments WHERE state = 'expired' AND expired_at IS NULL`))
      out.push(`reservation ${r.reservation_id} expired without evidence`)
    for (const r of await q(`SELECT reservation_id FROM assignments WHERE state IN ('completed', 'failed', 'expired', 'released') AND ended_at IS NULL AND expired_at IS NULL`))
      out.push(`reservation ${r.reservation_id} ended without an end time`)
    return out
  })
