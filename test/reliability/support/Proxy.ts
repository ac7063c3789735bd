import { createServer, request, type Server } from "node:http"
import type { Socket } from "node:net"

/**
 * An HTTP proxy on loopback in front of a server, to play a bad network:
 * `down()` refuses every connection until `up()`; `dropAfterCommit` forwards
 * matching requests to the server, lets it answer (and commit), then cuts the
 * client's connection instead of passing the answer on.
 */
export interface Proxy {
  readonly url: string
  readonly down: () => Promise<void>
  readonly up: () => Promise<void>
  /** The next `count` requests matching `match` reach the server; their answers are lost. */
  readonly dropAfterCommit: (match: (method: string, path: string) => boolean, count: number) => void
  /** Every request seen: method, path, upstream status (null when the answer was dropped or never came). */
  readonly log: Array<{ method: string; path: string; status: number | null; dropped: boolean }>
  /** Rewrites answers on their way back (for example to shift the clock a device sees). */
  rewrite: ((method: string, path: string, body: string) => string) | null
  /** Points the proxy at another upstream (a second server instance). */
  readonly retarget: (url: string) => void
  readonly close: () => Promise<void>
}

/** Starts a proxy to `target` on a fixed port when given (so `up()` comes back at the same address). */
export const start = async (target: string): Promise<Proxy> => {
  let upstream = new URL(target)
  const sockets = new Set<Socket>()
  const drops: Array<{ match: (method: string, path: string) => boolean; left: number }> = []
  const log: Proxy["log"] = []
  let port = 0
  let server: Server | null = null

  const listen = () =>
    new Promise<Server>((resolve) => {
      const srv = createServer((req, res) => {
        const chunks: Array<Buffer> = []
        req.on("data", (c: Buffer) => chunks.push(c))
        req.on("end", () => {
          const method = req.method ?? "GET"
          const path = req.url ?? "/"
          const rule = drops.find((d) => d.left > 0 && d.match(method, path))
          if (rule) rule.left--
          const entry = { method, path, status: null as number | null, dropped: rule !== undefined }
          log.push(entry)
          const up = request(
            { host: upstream.hostname, port: Number(upstream.port), method, path, headers: { ...req.headers, host: upstream.host } },
            (ures) => {
              const body: Array<Buffer> = []
              ures.on("data", (c: Buffer) => body.push(c))
              ures.on("end", () => {
                entry.status = ures.statusCode ?? null
                if (rule) {
                  // The server has answered, so it has committed: the client never hears of it.
                  req.socket.destroy()
                  return
                }
                const raw = Buffer.concat(body)
                const out = self.rewrite ? Buffer.from(self.rewrite(method, path, raw.toString("utf8"))) : raw
                res.writeHead(ures.statusCode ?? 502, { ...ures.headers, "content-length": String(out.length) })
                res.end(out)
              })
            }
          )
          up.on("error", () => req.socket.destroy())
          up.end(Buffer.concat(chunks))
        })
      })
      srv.on("connection", (s: Socket) => {
        sockets.add(s)
        s.on("close", () => sockets.delete(s))
      })
      srv.listen(port, "127.0.0.1", () => {
        port = (srv.address() as { port: number }).port
        resolve(srv)
      })
    })

  server = await listen()
  const self: Proxy = {
    url: `http://127.0.0.1:${port}`,
    down: () => down(),
    up: async () => {
      if (!server) server = await listen()
    },
    dropAfterCommit: (match, count) => void drops.push({ match, left: count }),
    log,
    rewrite: null,
    retarget: (url) => {
      upstream = new URL(url)
    },
    close: () => down()
  }
  const down = async () => {
    if (!server) return
    const s = server
    server = null
    for (const c of sockets) c.destroy()
    sockets.clear()
    await new Promise<void>((r) => s.close(() => r()))
  }
  return self
}
