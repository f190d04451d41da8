/**
 * `kvrelay relay`: discovery → relay host → HTTP API, until SIGINT/SIGTERM. Interruption closes
 * the scopes in reverse: the HTTP server stops accepting and ends its streams, then the host
 * withdraws every pool from the catalog and drains its actors, then discovery closes.
 */

import { randomBytes } from "node:crypto"
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { Effect, Layer } from "effect"
import type { DiscoveryConfig } from "../discovery/DiscoveryConfig.js"
import { discoveryLayer } from "../discovery/DiscoveryLayer.js"
import * as RelayHttpServer from "../relay/http/RelayHttpServer.js"
import { KvDcRelay } from "../relay/KvDcRelay.js"
import * as RelayHost from "../relay/RelayHost.js"
import { makeZmqEventTransport } from "../transport/ZmqEventTransport.js"
import { bindFailure, commandObservability, printListening, StartupProblem } from "./runtime.js"
import { serverSecurity } from "./security.js"
import { type RelaySettings, splitAddress } from "./settings.js"

/** A process-wide instance id (the Dynamo runtime's connection id); incarnations are per start. */
const processInstanceId = (): bigint => randomBytes(8).readBigUInt64LE() & 0x7fff_ffff_ffff_ffffn

/** `kvrelay relay`: discovery, the relay and its HTTP server, until interrupted. */
export const relayProgram = (settings: RelaySettings, discovery: DiscoveryConfig) =>
  Effect.gen(function* () {
    const relay = yield* KvDcRelay
    const { host, port } = splitAddress(settings.http)
    const security = yield* serverSecurity(settings)
    const address = yield* RelayHttpServer.serve(relay, {
      host,
      port,
      ...security,
      limits: {
        maxCatalogWatchers: settings.maxCatalogWatchers,
        maxReadinessWatchers: settings.maxReadinessWatchers,
        maxLoadWatchers: settings.maxLoadWatchers,
        maxRequestBodyBytes: settings.maxRequestBodyBytes
      }
    }).pipe(
      Effect.mapError(
        (error) =>
          new StartupProblem({
            flag: "--http",
            reason: `cannot listen on ${settings.http}: ${bindFailure(error.cause)}`,
            status: 2
          })
      )
    )
    yield* Effect.logInfo("KV DC relay serving").pipe(
      Effect.annotateLogs({
        url: address.url,
        dc: settings.dcId,
        dcId: relay.dcId.hex,
        incarnation: String(relay.identity.relayIncarnation)
      })
    )
    yield* printListening(address.url)
    return yield* Effect.never
  }).pipe(
    Effect.scoped,
    Effect.provide(
      RelayHost.layer({
        dcName: settings.dcId,
        drtInstanceId: processInstanceId(),
        eventTransport: makeZmqEventTransport(),
        scope: {
          namespaces: discovery.namespaces,
          endpointPrefixes: discovery.endpointPrefixes,
          watchAll: discovery.watchAll
        },
        expectedUniqueBlocks: settings.expectedUniqueBlocks,
        publicationThreshold: settings.publicationThreshold,
        publicationDelayMs: settings.publicationDelayMs,
        recoveryAttemptTimeoutMs: settings.recoveryAttemptTimeoutMs,
        publicationSource: { maxActiveStreams: settings.maxPoolStreams },
        registry: {
          maxInitializedPoolHubs: settings.maxInitializedPoolHubs,
          publication: { maxSubscribers: settings.maxSubscribersPerPool }
        }
      }).pipe(Layer.provide(discoveryLayer(discovery)), Layer.provide(NodeFileSystem.layer))
    ),
    // A file that cannot be read or holds an invalid document is a bad --discovery value. An etcd
    // that does not answer is no startup failure: the relay serves, reports discovery
    // `connecting`, and keeps retrying (PROTOCOL §1).
    Effect.catchTag("DiscoveryStartupError", (error) =>
      Effect.fail(
        new StartupProblem({
          flag: "--discovery",
          reason: `${error.backend}: ${error.reason}`,
          status: 2
        })
      )
    ),
    Effect.provide(commandObservability(settings, "kvrelay-relay", { "kvrelay.dc": settings.dcId }))
  )
