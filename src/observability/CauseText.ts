/**
 * The text of a failure's cause for logs and error messages: its message followed by the
 * messages of the causes it wraps (`fetch failed (connect ECONNREFUSED …)`), which is where
 * Node's HTTP client puts what actually went wrong.
 */

/** `cause`'s message and, in parentheses, those of the causes it wraps; `String(cause)` otherwise. */
export const causeChainText = (cause: unknown): string => {
  if (
    typeof cause === "object" &&
    cause !== null &&
    "message" in cause &&
    typeof cause.message === "string"
  ) {
    const inner = "cause" in cause ? cause.cause : undefined
    return inner === undefined || inner === null
      ? cause.message
      : `${cause.message} (${causeChainText(inner)})`
  }
  return String(cause)
}
