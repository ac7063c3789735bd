import { Effect, Tracer } from "effect"

/**
 * Runs an effect under a tracer that counts the statements @effect/sql sends
 * (each is one `sql.execute` span), and returns the count with the result.
 */
export const countStatements = <A, E, R>(self: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const native = yield* Effect.tracer
    let statements = 0
    const counting = Tracer.make({
      span: (name, ...rest) => {
        if (name === "sql.execute") statements++
        return native.span(name, ...rest)
      },
      context: native.context
    })
    const value = yield* Effect.withTracer(self, counting)
    return { value, statements }
  })
