/**
 * Discovery: the record backends (file, etcd), the membership projection (model cards →
 * `EndpointMembership`) and the KV source coordinator (sources → per-rank statuses and lifecycle
 * generations).
 */

import type * as FileSystem from "@effect/platform/FileSystem"
import type { Layer } from "effect"
import type { Discovery, DiscoveryStartupError } from "./Discovery.js"
import type { DiscoveryConfig } from "./DiscoveryConfig.js"
import { etcdDiscoveryLayer } from "./EtcdDiscovery.js"
import { fileDiscoveryLayer } from "./FileDiscovery.js"

export * from "./Discovery.js"
export * from "./DiscoveryConfig.js"
export * from "./DiscoveryFileWriter.js"
export * from "./DiscoveryRecords.js"
export * from "./EtcdDiscovery.js"
export * from "./FileDiscovery.js"
export * from "./KvSourceCoordinator.js"
export * from "./MembershipProjection.js"
export * from "./MembershipWatch.js"

/** The `Discovery` layer the configuration selects. */
export const discoveryLayer = (
  config: Pick<DiscoveryConfig, "backend" | "etcdPrefix">
): Layer.Layer<Discovery, DiscoveryStartupError, FileSystem.FileSystem> =>
  config.backend._tag === "File"
    ? fileDiscoveryLayer({ path: config.backend.path })
    : etcdDiscoveryLayer({ endpoints: config.backend.endpoints, prefix: config.etcdPrefix })
