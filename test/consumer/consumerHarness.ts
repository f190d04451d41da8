/**
 * The consumer side of the integration tests: a `GlobalConsumer` over real HTTP relay clients, its
 * view and its HTTP server on an ephemeral port, plus convergence checks against the producers.
 */

import { Context, Duration, Effect, Layer } from "effect"
import * as GlobalProcess from "../../src/cli/globalProcess.js"
import {
  GlobalConsumer,
  type GlobalConsumerConfig,
  type GlobalConsumerService
} from "../../src/consumer/GlobalConsumer.js"
import { GlobalView, type OverlapResult } from "../../src/consumer/GlobalView.js"
import * as GlobalHttpServer from "../../src/consumer/http/GlobalHttpServer.js"
import type { RelayPool } from "./realRelay.js"

/** The production composition (`layerGlobal`) on an ephemeral port, in the current scope. */
export const startConsumer = (
  relays: ReadonlyArray<{ readonly name: string; readonly url: string }>,
  config: Partial<GlobalConsumerConfig> = {}
) =>
  Effect.gen(function* () {
    const context = yield* Layer.build(
      GlobalProcess.layer({ relays, ...config }, { host: "127.0.0.1", port: 0 })
    )
    const consumer = Context.get(context, GlobalConsumer)
    const view = Context.get(context, GlobalView)
    const url = yield* GlobalHttpServer.serverUrl.pipe(Effect.provide(context))
    return { consumer, view, url }
  })

/** Polls `check` on the live clock until it holds; dies with `what` after `timeoutMs`. */
export const eventually = <E, R>(what: string, check: Effect.Effect<boolean, E, R>, timeoutMs = 10_000) =>
  Effect.gen(function* () {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      if (yield* check) return
      if (Date.now() > deadline)
        return yield* Effect.dieMessage(`timed out after ${timeoutMs} ms waiting until ${what}`)
      yield* Effect.sleep(Duration.millis(20))
    }
  })

const sameWords = (a: Uint32Array, b: Uint32Array): boolean =>
  a.length === b.length &&
  Buffer.compare(
    Buffer.from(a.buffer, a.byteOffset, a.byteLength),
    Buffer.from(b.buffer, b.byteOffset, b.byteLength)
  ) === 0

/** The relay's lane is ready on the pool's current producer and holds exactly the producer's words. */
export const converged = (
  consumer: GlobalConsumerService,
  relay: string,
  pool: RelayPool
): Effect.Effect<boolean> =>
  Effect.gen(function* () {
    const words = yield* pool.words
    for (const domain of consumer.domains()) {
      for (const lane of domain.lanes.values()) {
        if (lane.relay !== relay || !lane.descriptor.producer.equals(pool.attachment.identity)) continue
        return lane.ready && sameWords(domain.indexer.laneWords(lane.lane), words)
      }
    }
    return false
  })

export const depthsOf = (answer: ReadonlyArray<OverlapResult> | Error): Record<string, number> => {
  if (!Array.isArray(answer)) throw answer
  return Object.fromEntries((answer as ReadonlyArray<OverlapResult>).map((r) => [r.relay, r.prefixDepth]))
}

/** `count` distinct pseudo-random u64 block hashes from `seed`. */
export const blockHashes = (seed: number, count: number): Array<bigint> => {
  let a = (seed * 0x9e37_79b9) | 1
  let b = (seed ^ 0x5bd1_e995) | 1
  const out: Array<bigint> = []
  for (let i = 0; i < count; i++) {
    a ^= a << 13
    a ^= a >>> 17
    a ^= a << 5
    b ^= b << 7
    b ^= b >>> 9
    b ^= b << 8
    out.push((BigInt(a >>> 0) << 32n) | BigInt(b >>> 0))
  }
  return out
}
