/**
 * The relay host's worker queries (PROTOCOL §5.1 ◆3): each endpoint's expected ranks (listed in
 * every answer, zero depths included), the query through the pool's actor, the same query on the
 * caller's turn when the actor is at rest, and `GET /workers`' ranks.
 *
 * The expected ranks are read from the endpoint's subscriber health, which walks every source, so
 * queries reuse one read for up to a second: a rank advertised meanwhile is listed that much
 * later (what it holds is counted at once).
 */

import { Effect } from "effect"
import { compareMembers, memberKey } from "../../ckf/events.js"
import type { EndpointId } from "../../protocol/Model.js"
import type * as EndpointSlot from "../EndpointSlot.js"
import type { EndpointSourceRank, EndpointWorkerQuery, KvDcRelayService } from "../KvDcRelay.js"
import { type KvDcRelayError, UnknownEndpoint } from "../RelayErrors.js"

/** The host's query entries of `KvDcRelayService`. */
export type HostWorkerQueries = Pick<KvDcRelayService, "queryWorkers" | "queryWorkersNow" | "sourceRanks">

/** Worker queries over the host's slots: `statusOf` is an endpoint's running slot's status. */
export const make = (
  statusOf: (endpoint: EndpointId) => EndpointSlot.EndpointSlotStatus | undefined
): Effect.Effect<HostWorkerQueries> =>
  Effect.gen(function* () {
    const clock = yield* Effect.clock
    const rankCache = new WeakMap<
      EndpointSlot.EndpointSlotStatus,
      { readonly at: number; readonly subscriber: unknown; readonly ranks: ReadonlyArray<EndpointSourceRank> }
    >()

    /** The expected ranks while the cache holds a read of this subscriber under a second old. */
    const cachedRanks = (
      status: EndpointSlot.EndpointSlotStatus
    ): ReadonlyArray<EndpointSourceRank> | undefined => {
      if (status.subscriber === undefined) return []
      const cached = rankCache.get(status)
      return cached?.subscriber === status.subscriber && clock.unsafeCurrentTimeMillis() - cached.at < 1000
        ? cached.ranks
        : undefined
    }

    /** The endpoint's expected source ranks, in (worker id, rank) order. */
    const expectedRanks = (
      status: EndpointSlot.EndpointSlotStatus
    ): Effect.Effect<ReadonlyArray<EndpointSourceRank>> =>
      Effect.gen(function* () {
        const fresh = cachedRanks(status)
        if (fresh !== undefined) return fresh
        const subscriber = status.subscriber!
        const seen = new Set<string>()
        const ranks: Array<EndpointSourceRank> = []
        for (const source of (yield* subscriber.health).expected) {
          const key = memberKey(source.workerId, source.dpRank)
          if (seen.has(key)) continue
          seen.add(key)
          ranks.push({
            workerId: source.workerId,
            dpRank: source.dpRank,
            transportEndpoint: source.transportEndpoint
          })
        }
        ranks.sort(compareMembers)
        rankCache.set(status, { at: clock.unsafeCurrentTimeMillis(), subscriber, ranks })
        return ranks
      })

    const queryWorkers = (
      endpoint: EndpointId,
      hashes: Uint32Array
    ): Effect.Effect<EndpointWorkerQuery, KvDcRelayError> =>
      Effect.gen(function* () {
        const status = statusOf(endpoint)
        const actor = status?.attachment?.actor
        if (status === undefined || actor === undefined)
          return yield* new UnknownEndpoint({ endpoint: endpoint.toString() })
        const expected = yield* expectedRanks(status)
        const result = yield* actor.queryWorkers({ hashes, count: hashes.length >>> 1, expected })
        return { servingEndpoint: endpoint, result }
      })

    // Undefined when there is no pool, the expected ranks are to be read, or the actor is busy.
    const queryWorkersNow = (endpoint: EndpointId, hashes: Uint32Array): EndpointWorkerQuery | undefined => {
      const status = statusOf(endpoint)
      const expected = status === undefined ? undefined : cachedRanks(status)
      if (status?.attachment === undefined || expected === undefined) return undefined
      const result = status.attachment.actor.queryWorkersNow({ hashes, count: hashes.length >>> 1, expected })
      return result === undefined ? undefined : { servingEndpoint: endpoint, result }
    }

    const sourceRanks = (endpoint: EndpointId): Effect.Effect<ReadonlyArray<EndpointSourceRank>> =>
      Effect.suspend(() => {
        const status = statusOf(endpoint)
        return status === undefined ? Effect.succeed([]) : expectedRanks(status)
      })

    return { queryWorkers, queryWorkersNow, sourceRanks }
  })
