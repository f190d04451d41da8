/**
 * The decoders' fast paths (exact-shape readers tried before the general ones) are on unless a
 * test turns them off to check that both paths decode and reject the same inputs alike; `hits`
 * counts the envelopes and events the fast paths read (tests: the exact shapes do take them).
 * Production code only reads this switch.
 */
export const fastPaths = { enabled: true, hits: { envelopes: 0, events: 0 } }

/** Tests only: decode with the general readers alone (`false`) or with the fast paths first (`true`). */
export const setDecoderFastPaths = (enabled: boolean): void => {
  fastPaths.enabled = enabled
}

/** Envelopes and events the fast paths have read. */
export const decoderFastPathHits = fastPaths.hits
