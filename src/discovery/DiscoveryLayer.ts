/**
 * The `Discovery` service a relay's configuration selects: file or etcd. The rest of discovery is
 * the membership projection (model cards → `EndpointMembership`) and the KV source coordinator
 * (sources → per-rank statuses and lifecycle generations).
 */

import type * as FileSystem from "@effect/platform/FileSystem"
import type { Layer } from "effect"
import type { Discovery, DiscoveryStartupError } from "./Discovery.js"
import type { DiscoveryConfig } from "./DiscoveryConfig.js"
import { etcdDiscoveryLayer } from "./EtcdDiscovery.js"
import { fileDiscoveryLayer } from "./FileDiscovery.js"

/** The `Discovery` layer the configuration selects. */
export const discoveryLayer = (
  config: Pick<DiscoveryConfig, "backend" | "etcdPrefix">
): Layer.Layer<Discovery, DiscoveryStartupError, FileSystem.FileSystem> =>
  config.backend._tag === "File"
    ? fileDiscoveryLayer({ path: config.backend.path })
    : etcdDiscoveryLayer({ endpoints: config.backend.endpoints, prefix: config.etcdPrefix })
