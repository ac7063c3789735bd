// file: docs/examples/my-runner.mjs
// A runner: a plain async function the worker runs inside its execution unit, under the hard
// target-scan deadline. `ctx.enter` journals a phase; the return value is the result.
export default async function run(ctx) {
  ctx.enter("scanning")
  await new Promise((resolve) => setTimeout(resolve, 50))
  const findings = ctx.target.identity.endsWith("-leaky") ? [{ detector: "AWSAccessKey", file: "config/.env" }] : []
  ctx.enter("filtering")
  return { outcome: findings.length > 0 ? "findings" : "clean", findings }
}
