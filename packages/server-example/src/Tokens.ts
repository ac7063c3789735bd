import { createHash, randomBytes, timingSafeEqual } from "node:crypto"

/** Prefix that makes a scanfleet device token recognisable in a secret scanner. */
export const prefix = "sfd_"

/** A new device token: 32 random bytes, base64url. Shown once; only its hash is stored. */
export const generate = (): string => prefix + randomBytes(32).toString("base64url")

/** The stored form of a token: hex SHA-256. */
export const hash = (token: string): string => createHash("sha256").update(token, "utf8").digest("hex")

/**
 * Compares two secrets in constant time. Both sides are hashed first so the
 * comparison never leaks the length of the expected secret.
 */
export const equal = (given: string, expected: string): boolean =>
  timingSafeEqual(createHash("sha256").update(given, "utf8").digest(), createHash("sha256").update(expected, "utf8").digest())

/** Extracts the token of an `Authorization: Bearer <token>` header. */
export const fromAuthorization = (header: string | undefined): string | null => {
  if (!header) return null
  const m = /^Bearer\s+(\S+)\s*$/i.exec(header)
  return m ? m[1] : null
}
