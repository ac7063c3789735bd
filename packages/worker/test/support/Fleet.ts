import { Config, FindingStore, Store } from "@scanfleet/core"
import { Database, Server, ServerConfig } from "@scanfleet/server-example"
import { Effect, Layer, ManagedRuntime } from "effect"
import { createServer, Socket, type Server as NetServer } from "node:net"
import * as Poll from "./Poll.js"

/**
 * The real scanfleet server (server-example over the in-memory store) on
 * loopback, configured with deadlines short enough for tests, plus a TCP
 * proxy that can play an unreachable network.
 */

const adminToken = "worker-tests-admin-token-0123456789"

/** A running server with a registered device. */
export interface Fleet {
  readonly url: string
  readonly token: string
  readonly deviceId: number
  /** The fleet id of the server's database. */
  readonly fleetId: string
  /** Adds pending github targets. */
  readonly seed: (identities: ReadonlyArray<string>) => Promise<void>
  /** The server's accepted timeline of a reservation. */
  readonly timeline: (reservationId: number) => Promise<ReadonlyArray<{ seq: number; kind: string; phase: string; at: number; detail?: string; acceptedAt: number }>>
  /** The server's view of a reservation. */
  readonly assignment: (reservationId: number) => Promise<{ state: string; outcome: string | null; finalPhase: string | null; expiresAt: number; lastSeq: number }>
  /** The server's view of a reservation once its result is accepted (polled, also while it is not claimed yet; fails after `ms`). */
  readonly settled: (reservationId: number, ms?: number) => Promise<{ state: string; outcome: string | null; finalPhase: string | null; expiresAt: number; lastSeq: number }>
  /** The newest reservation of a github target, once it is claimed (polled; fails after `ms`). */
  readonly reservationOf: (identity: string, ms?: number) => Promise<number>
  /** Every finding the server stored. */
  readonly findings: () => Promise<ReadonlyArray<{ readonly detector: string; readonly path: string; readonly fingerprint: string; readonly preview: string; readonly details: unknown }>>
  /** An operator cancels a reservation through the admin API. */
  readonly cancel: (reservationId: number, reason: string) => Promise<void>
  /** An operator revokes the device through the admin API. */
  readonly revoke: (reason: string) => Promise<void>
  readonly close: () => Promise<void>
}

/** Starts the server with a target-scan timeout of `scanSeconds` for github, over the in-memory store or `databaseUrl`. */
export const start = async (opts: {
  readonly scanSeconds: number
  readonly uploadSeconds?: number
  readonly ttlSeconds?: number
  readonly slots?: number
  readonly databaseUrl?: string
}): Promise<Fleet> => {
  const config = ServerConfig.make({ adminToken, host: "127.0.0.1", port: 0, sweepIntervalMs: 100, logLevel: "none", databaseUrl: opts.databaseUrl ?? "memory:" })
  const rt = ManagedRuntime.make(Server.layer(config).pipe(Layer.provideMerge(opts.databaseUrl ? Database.layer(opts.databaseUrl, { poolSize: 4 }) : FindingStore.layerMemory)))
  const info = await rt.runPromise(Server.Info)
  const store = await rt.runPromise(Store.Store)
  const admin = async (path: string, body: unknown, method = "POST") => {
    const res = await fetch(info.url + path, { method, headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" }, ...(body === undefined ? {} : { body: JSON.stringify(body) }) })
    const json = (await res.json()) as any
    if (res.status >= 300) throw new Error(`${path}: ${res.status} ${JSON.stringify(json)}`)
    return json
  }
  const doc: Config.ManagedConfig = {
    ...Config.defaults,
    // github (the tests' source) runs on the short global TTL; the other sources keep their long defaults under overrides.
    assignments: {
      globalTtlSeconds: opts.ttlSeconds ?? 60,
      handoffMarginSeconds: 1,
      overrides: { gitlab: { ttlSeconds: 7200 }, huggingface: { ttlSeconds: 7200 }, dockerhub: { ttlSeconds: 7200 } }
    },
    sources: { ...Config.defaults.sources, github: { ...Config.defaults.sources.github, scanTimeoutSeconds: opts.scanSeconds, uploadTimeoutSeconds: opts.uploadSeconds ?? 10 } }
  }
  await admin("/v1/admin/config/apply", doc)
  const dev = await admin("/v1/admin/devices", { name: "test-device", slots: opts.slots ?? 4 })
  const fleet = await rt.runPromise(store.fleet())
  return {
    url: info.url,
    token: dev.token,
    deviceId: dev.device.id,
    fleetId: fleet.id,
    seed: (ids) => rt.runPromise(store.recordObservations(ids.map((identity) => ({ source: "github" as const, identity, remoteAt: null })), Date.now())).then(() => {}),
    timeline: (id) => rt.runPromise(store.timeline(id)) as any,
    assignment: (id) => rt.runPromise(store.getAssignment(id)),
    settled: (id, ms = 60_000) =>
      Poll.until(
        "the result at the server",
        () =>
          rt.runPromise(
            store.getAssignment(id).pipe(
              Effect.map((x) => (x.outcome !== null ? x : null)),
              Effect.catchTag("NotFound", () => Effect.succeed(null))
            )
          ),
        ms,
        50
      ),
    reservationOf: (identity, ms = 30_000) =>
      Poll.until(
        `a claim of ${identity}`,
        () =>
          rt.runPromise(
            Effect.map(store.listAssignments({ limit: 1000 }), (all) => {
              const mine = all.filter((a) => a.identity === identity).map((a) => a.reservationId)
              return mine.length === 0 ? null : Math.max(...mine)
            })
          ),
        ms,
        50
      ),
    findings: () => rt.runPromise(Effect.flatMap(FindingStore.FindingStore, (f) => f.list({ limit: 10_000 }))).then((p) => p.findings),
    cancel: (id, reason) => admin(`/v1/admin/assignments/${id}/cancel`, { reason }).then(() => {}),
    revoke: (reason) => admin(`/v1/admin/devices/${dev.device.id}?${new URLSearchParams({ reason })}`, undefined, "DELETE").then(() => {}),
    close: () => rt.dispose()
  }
}

/** A TCP proxy in front of a server; `down()` refuses and cuts every connection until `up()`. */
export interface Proxy {
  readonly url: string
  readonly down: () => Promise<void>
  readonly up: () => Promise<void>
  readonly close: () => Promise<void>
}

/** Starts a proxy to `target` (an http://host:port URL). */
export const proxy = async (target: string): Promise<Proxy> => {
  const t = new URL(target)
  const sockets = new Set<Socket>()
  let port = 0
  const listen = () =>
    new Promise<NetServer>((resolve) => {
      const srv = createServer((client) => {
        const upstream = new Socket()
        sockets.add(client).add(upstream)
        upstream.connect(Number(t.port), t.hostname)
        client.pipe(upstream).pipe(client)
        const drop = () => {
          client.destroy()
          upstream.destroy()
          sockets.delete(client)
          sockets.delete(upstream)
        }
        client.on("error", drop).on("close", drop)
        upstream.on("error", drop).on("close", drop)
      })
      srv.listen(port, "127.0.0.1", () => {
        port = (srv.address() as { port: number }).port
        resolve(srv)
      })
    })
  let server: NetServer | null = await listen()
  const down = async () => {
    if (!server) return
    const s = server
    server = null
    for (const c of sockets) c.destroy()
    sockets.clear()
    await new Promise<void>((r) => s.close(() => r()))
  }
  return {
    url: `http://127.0.0.1:${port}`,
    down,
    up: async () => {
      if (!server) server = await listen()
    },
    close: down
  }
}
