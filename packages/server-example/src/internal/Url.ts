/**
 * The request target as a URL. A target such as `//x` is a scheme-relative
 * URL to `new URL`, which would throw; prefixing the origin never does.
 */
export const parse = (target: string): URL => {
  try {
    return new URL(`http://localhost${target.startsWith("/") ? "" : "/"}${target}`)
  } catch {
    return new URL("http://localhost/")
  }
}
