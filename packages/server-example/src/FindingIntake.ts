import { Findings, FindingsApi } from "@scanfleet/core"
import { Effect } from "effect"
import { createCipheriv, createDecipheriv, createHmac, randomBytes } from "node:crypto"
import type { z } from "zod"
import { ApiError, issuesOf } from "./ApiError.js"
import type { ServerConfig } from "./ServerConfig.js"

/**
 * The server's side of redaction: the fleet key it hands devices, the check
 * that refuses a result whose findings still carry a declared secret field in
 * the clear, and the sealing of raw values (the explicit opt-in).
 *
 * Neither key is in the database. The fleet key is derived from the
 * `findingsKey` setting (the admin token when it is absent), so every server of
 * one fleet derives the same key and fingerprints match across restarts; the
 * raw-upload key is the `findingsRawKey` setting.
 */

/** The fleet key (hex) and its id, derived from the server's settings. */
export const fleetKey = (settings: Pick<ServerConfig, "adminToken" | "findingsKey">): z.infer<typeof FindingsApi.FleetKey> => {
  const key = createHmac("sha256", settings.findingsKey ?? settings.adminToken).update("scanfleet/fleet-fingerprint-key/v1").digest("hex")
  return { keyId: createHmac("sha256", key).update("key-id").digest("hex").slice(0, 16), key }
}

/** Seals clear values with AES-256-GCM under the raw-upload key: `v1.<iv>.<tag>.<ciphertext>` (base64url). */
export const seal = (rawKeyHex: string, values: Readonly<Record<string, string>>): string => {
  const iv = randomBytes(12)
  const c = createCipheriv("aes-256-gcm", Buffer.from(rawKeyHex, "hex"), iv)
  const ct = Buffer.concat([c.update(JSON.stringify(values), "utf8"), c.final()])
  return ["v1", iv.toString("base64url"), c.getAuthTag().toString("base64url"), ct.toString("base64url")].join(".")
}

/** Opens a sealed value with the raw-upload key (an operator's tool; the server never does it on a request). */
export const unseal = (rawKeyHex: string, sealed: string): Record<string, string> => {
  const [v, iv, tag, ct] = sealed.split(".")
  if (v !== "v1" || !iv || !tag || ct === undefined) throw new Error("not a v1 sealed value")
  const d = createDecipheriv("aes-256-gcm", Buffer.from(rawKeyHex, "hex"), Buffer.from(iv, "base64url"))
  d.setAuthTag(Buffer.from(tag, "base64url"))
  return JSON.parse(Buffer.concat([d.update(Buffer.from(ct, "base64url")), d.final()]).toString("utf8")) as Record<string, string>
}

const refuse = (message: string, issues: Array<{ path: Array<string | number>; message: string }>) =>
  new ApiError({ status: 422, error: "unredacted_finding", message, issues })

/**
 * Checks and converts a result's findings before anything is stored: 422 when
 * a declared secret field is in the clear (naming each field's path), when a
 * finding is not in the reported shape, or when it carries raw values and raw
 * upload is not enabled. Raw values are sealed; nothing clear is returned.
 */
export const accept = (findings: ReadonlyArray<unknown>, settings: Pick<ServerConfig, "findingsRawKey">): Effect.Effect<ReadonlyArray<Findings.Accepted>, ApiError> =>
  Effect.suspend(() => {
    const clear = findings.flatMap((f, i) => Findings.unredacted(f).map((u) => ({
        path: ["findings", i, ...u.path],
        message: u.badPreview
          ? `declared secret field "${u.field}" is not redacted: its marker's preview is not Findings.preview's form (…(length), or up to four characters then …(length))`
          : `declared secret field "${u.field}" is not redacted`
      })))
    if (clear.length > 0)
      return Effect.fail(
        refuse(
          `${clear.length} declared secret field${clear.length === 1 ? "" : "s"} not redacted (${clear.slice(0, 3).map((c) => c.path.join(".")).join(", ")}${clear.length > 3 ? ", …" : ""}); devices replace each with { redacted: <fingerprint>, preview } before upload, and nothing of this result was stored`,
          clear
        )
      )
    const out: Array<Findings.Accepted> = []
    for (const [i, f] of findings.entries()) {
      const r = Findings.ReportedSchema.safeParse(f)
      if (!r.success) {
        const issues = issuesOf(r.error, ["findings", i])
        return Effect.fail(refuse(`finding ${i} is not a redacted finding: ${issues.map((x) => `${x.path.join(".")}: ${x.message}`).join("; ")}`, issues))
      }
      const { raw, ...rest } = r.data
      if (raw !== undefined && Object.keys(raw).length > 0 && settings.findingsRawKey === undefined)
        return Effect.fail(
          refuse(`finding ${i} carries raw values but raw upload is not enabled on this server (set findingsRawKey / SCANFLEET_FINDINGS_RAW_KEY to opt in); nothing was stored`, [
            { path: ["findings", i, "raw"], message: "raw upload is not enabled" }
          ])
        )
      out.push({ ...rest, sealed: raw !== undefined && Object.keys(raw).length > 0 ? seal(settings.findingsRawKey!, raw) : null })
    }
    return Effect.succeed(out)
  })
