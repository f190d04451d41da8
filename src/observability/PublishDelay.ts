/**
 * How long a pool's changes wait to be published: per pool actor, from the admission of the
 * oldest event a publication carries to the publication itself, as a histogram that
 * `GET /metrics` shows as `kv_dc_relay_publish_delay_seconds{endpoint}`.
 *
 * The delay is read on the actor's `Clock` in milliseconds (the live clock's resolution), so a
 * delta published within the millisecond its first event arrived counts as 0 and the lowest
 * bucket holds everything under ~1 ms. What it leaves out: the socket read and decode before
 * admission, and the hub, the stream write and the network after the publication.
 */

/** Upper bounds of the buckets, in seconds (Prometheus `le`); a last bucket takes the rest. */
export const PUBLISH_DELAY_BOUNDS_SECONDS: ReadonlyArray<number> = [
  0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5
]

/** The publish-delay histogram's counts and sum at one moment. */
export interface PublishDelaySnapshot {
  /**
   * Publications per bucket, not cumulative: `counts[i]` took at most
   * `PUBLISH_DELAY_BOUNDS_SECONDS[i]` and more than the bound before; the last entry is the rest.
   */
  readonly counts: ReadonlyArray<number>
  readonly sumSeconds: number
  readonly count: number
}

/** The histogram with nothing observed. */
export const EMPTY_PUBLISH_DELAY: PublishDelaySnapshot = {
  counts: PUBLISH_DELAY_BOUNDS_SECONDS.map(() => 0).concat(0),
  sumSeconds: 0,
  count: 0
}

const BOUNDS_MS = PUBLISH_DELAY_BOUNDS_SECONDS.map((s) => s * 1000)

/** The actor's histogram: a plain counter array, written once per publication. */
export class PublishDelayHistogram {
  private readonly counts = new Float64Array(BOUNDS_MS.length + 1)
  private sumMs = 0

  observe(ms: number): void {
    const delay = Math.max(0, ms)
    let i = 0
    while (i < BOUNDS_MS.length && delay > BOUNDS_MS[i]!) i++
    this.counts[i] = this.counts[i]! + 1
    this.sumMs += delay
  }

  snapshot(): PublishDelaySnapshot {
    const counts = Array.from(this.counts)
    return { counts, sumSeconds: this.sumMs / 1000, count: counts.reduce((a, n) => a + n, 0) }
  }
}
