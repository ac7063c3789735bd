/**
 * The built-in demo scanner (`Scanner.demo()`). It derives its findings from
 * the identity alone, so the same target always yields the same findings,
 * and prints them as JSON lines. Exit codes: 0 clean, 3 findings, 2 usage.
 * An identity containing the slow marker sleeps the slow delay instead, so a
 * demo can overrun a deadline.
 */
import { createHash } from "node:crypto"
import { parseArgs } from "node:util"

const usage = "usage: demo-scanner --identity ID [--delay-ms N]"

const parse = () => {
  try {
    return parseArgs({
      options: {
        identity: { type: "string" },
        source: { type: "string", default: "github" },
        "delay-ms": { type: "string", default: "200" },
        "slow-marker": { type: "string", default: "slow" },
        "slow-delay-ms": { type: "string", default: "3600000" }
      }
    }).values
  } catch (e) {
    process.stderr.write(`${usage}: ${(e as Error).message}\n`)
    return process.exit(2)
  }
}

const values = parse()
if (!values.identity) {
  process.stderr.write(`${usage}\n`)
  process.exit(2)
}
const identity = values.identity
const slow = values["slow-marker"] !== "" && identity.includes(values["slow-marker"])
const delay = Number(slow ? values["slow-delay-ms"] : values["delay-ms"])
const digest = createHash("sha256").update(`${values.source}:${identity}`).digest()
const count = digest[0] % 3
process.stderr.write(`demo: scanning ${values.source}:${identity} for ${delay} ms\n`)
setTimeout(() => {
  for (let i = 0; i < count; i++) {
    const n = digest.readUInt16BE(1 + 2 * i)
    const finding = { detector: "DemoKey", file: `config/settings-${n}.env`, line: (n % 200) + 1, fingerprint: digest.subarray(8 + 4 * i, 12 + 4 * i).toString("hex") }
    process.stdout.write(`${JSON.stringify(finding)}\n`)
  }
  process.exit(count > 0 ? 3 : 0)
}, delay)
