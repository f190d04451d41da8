/** Discovery records for tests, decoded through the real JSON schemas. */

import { Either } from "effect"
import type { KvEventSource } from "../../src/protocol/Discovery.js"
import {
  KvEventSourceJson,
  type ModelCardInstance,
  ModelCardInstanceJson
} from "../../src/protocol/Discovery.js"
import { decodeJson } from "../../src/protocol/Json.js"
import { EndpointId } from "../../src/protocol/Model.js"

const decodeCard = decodeJson(ModelCardInstanceJson)
const decodeSource = decodeJson(KvEventSourceJson)

export interface CardSpec {
  readonly endpoint?: string
  readonly worker?: string | number
  readonly suffix?: string | null
  readonly name?: string
  readonly sourcePath?: string
  readonly blockSize?: number
  readonly aliases?: ReadonlyArray<string>
  readonly workerType?: string | null
  readonly lora?: { readonly name: string; readonly maxGpuLoraCount?: number } | null
  readonly runtime?: Readonly<Record<string, unknown>>
  readonly indexerIdentity?: unknown
}

/** The raw JSON of a card instance (PROTOCOL §2). */
export const rawCard = (spec: CardSpec = {}): Record<string, unknown> => {
  const [namespace, component, endpoint] = (spec.endpoint ?? "prod.backend.generate").split(".")
  return {
    namespace,
    component,
    endpoint,
    instanceId: String(spec.worker ?? 1),
    modelSuffix: spec.suffix ?? null,
    card: {
      name: spec.name ?? "llama",
      sourcePath: spec.sourcePath ?? "meta/llama",
      kvCacheBlockSize: spec.blockSize ?? 64,
      aliases: spec.aliases ?? [],
      workerType: spec.workerType === undefined ? "aggregated" : spec.workerType,
      lora: spec.lora ?? null,
      indexerIdentity: spec.indexerIdentity ?? null,
      runtimeConfig: { ...spec.runtime }
    }
  }
}

export const card = (spec: CardSpec = {}): ModelCardInstance =>
  Either.getOrThrowWith(decodeCard(rawCard(spec)), (e) => new Error(e.message))

export interface SourceSpec {
  readonly endpoint?: string
  readonly worker?: string | number
  readonly rank?: number
  readonly publisher?: string | number
  readonly recovery?: string | null
  readonly kind?: "dynamo-zmq" | "engine-zmq"
  readonly replay?: string | null
}

export const rawSource = (spec: SourceSpec = {}): Record<string, unknown> => ({
  kvStateEndpoint: spec.endpoint ?? "prod.backend.generate",
  workerId: String(spec.worker ?? 1),
  dpRank: spec.rank ?? 0,
  publisherId: String(spec.publisher ?? 100),
  transport:
    spec.kind === "engine-zmq"
      ? {
          kind: "engine-zmq",
          endpoint: "tcp://127.0.0.1:5557",
          topic: "",
          replayEndpoint: spec.replay ?? null
        }
      : { kind: "dynamo-zmq", endpoint: "tcp://127.0.0.1:5557", topic: "kv-events" },
  recoveryTarget: spec.recovery === undefined || spec.recovery === null ? null : { endpoint: spec.recovery }
})

export const source = (spec: SourceSpec = {}): KvEventSource =>
  Either.getOrThrowWith(decodeSource(rawSource(spec)), (e) => new Error(e.message))

export const endpoint = (text: string): EndpointId =>
  Either.getOrThrowWith(EndpointId.parse(text), (e) => new Error(e.message))
