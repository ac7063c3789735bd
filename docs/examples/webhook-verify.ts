// file: docs/examples/webhook-verify.ts
import { createHmac, timingSafeEqual } from "node:crypto"
import { createServer } from "node:http"
import { Webhooks } from "@scanfleet/server-example"

// A receiver needs only node:crypto: recompute HMAC-SHA256 over "<t>.<raw body>" with the
// shared secret, compare in constant time, and refuse a timestamp older than five minutes.
const verify = (secret: string, rawBody: string, header: string | undefined, now = Date.now()): boolean => {
  const parts = Object.fromEntries((header ?? "").split(",").map((p) => p.split("=", 2)))
  const t = Number(parts.t)
  if (!Number.isSafeInteger(t) || Math.abs(now - t) > 5 * 60_000 || typeof parts.v1 !== "string") return false
  const want = Buffer.from(createHmac("sha256", secret).update(`${t}.${rawBody}`).digest("hex"))
  const got = Buffer.from(parts.v1)
  return got.length === want.length && timingSafeEqual(got, want)
}

const secret = "the-webhook-secret-of-this-fleet"
const seen = new Set<string>()
const receiver = createServer((req, res) => {
  // The raw bytes, decoded once: a character split across two chunks stays whole.
  const chunks: Array<Buffer> = []
  req.on("data", (c: Buffer) => chunks.push(c))
  req.on("end", () => {
    const body = Buffer.concat(chunks).toString("utf8")
    if (!verify(secret, body, req.headers["scanfleet-signature"] as string | undefined)) return res.writeHead(401).end()
    // Delivery is at least once: deduplicate on the event's seq, which the signature covers
    // (the scanfleet-event header repeats it, unsigned, for routing).
    const seq = String(JSON.parse(body).seq)
    if (!seen.has(seq)) {
      seen.add(seq)
      console.log("event", seq, JSON.parse(body).scan)
    }
    res.writeHead(204).end()
  })
})
await new Promise<void>((r) => receiver.listen(0, "127.0.0.1", r))
const { port } = receiver.address() as { port: number }

// What the server sends (Webhooks.sign is the server's own signer).
const body = JSON.stringify({ seq: 7, type: "scan.related", scan: { identity: "acme/api", new: 1, present: 2, resolved: 1 }, findings: [] })
const send = (signature: string) =>
  fetch(`http://127.0.0.1:${port}/hook`, { method: "POST", headers: { "content-type": "application/json", "scanfleet-signature": signature, "scanfleet-event": "7" }, body })
const good = await send(Webhooks.sign(secret, body, Date.now()))
const forged = await send(Webhooks.sign("another-secret-0123456789", body, Date.now()))
const replayed = await send(Webhooks.sign(secret, body, Date.now() - 10 * 60_000))
console.log(good.status, forged.status, replayed.status) // 204 401 401
receiver.close()
if (good.status !== 204 || forged.status !== 401 || replayed.status !== 401) process.exit(1)
