/**
 * A small typed HTTP client for routers (`kvrelay/client`): a relay's worker-level queries
 * (PROTOCOL §5.1 ◆3: `POST /v1/query`, and Dynamo's standalone-indexer routes `POST /query`,
 * `POST /query_by_hash`, `GET /workers`) and the global consumer's `POST /v1/overlap` (§7).
 * Plain `fetch`, no Effect: errors are thrown as `KvrelayHttpError`, which carries the status and
 * the server's error body.
 *
 * Hashes are bigints on this side. In bodies they are written as the contract asks: u64 as
 * decimal strings (`localBlockHashes`), Dynamo's `block_hashes` as exact i64 JSON numbers (a
 * double cannot carry them, so the body text is written by hand).
 *
 * ```ts
 * import { RelayQueryClient } from "kvrelay/client"
 * const relay = new RelayQueryClient("http://relay-a:8080", { token: process.env.KVRELAY_TOKEN })
 * const { pools } = await relay.query({ namespace: "prod", model: "llama", tokens, cacheSalt: "user-42" })
 * const best = pools[0]?.workers[0]   // the member with the deepest device match
 * ```
 */

import type { DynamoScoreResponse, PoolWorkersAnswer } from "../ckf/workerQuery.js"

/** A non-2xx answer: its status and the server's body (`{reason, message}` or Dynamo's `{error}`). */
export class KvrelayHttpError extends Error {
  constructor(
    readonly status: number,
    readonly body: unknown,
    readonly route: string
  ) {
    const detail =
      typeof body === "object" && body !== null
        ? ((body as { message?: unknown; error?: unknown }).message ?? (body as { error?: unknown }).error)
        : undefined
    super(`${route}: HTTP ${status}${typeof detail === "string" ? `: ${detail}` : ""}`)
    this.name = "KvrelayHttpError"
  }

  /** The contract's reason (`MODEL_NOT_FOUND`, …), when the body has one. */
  get reason(): string | undefined {
    const reason = (this.body as { reason?: unknown } | null)?.reason
    return typeof reason === "string" ? reason : undefined
  }
}

/** Bearer token, `fetch` and per-request timeout of the clients. */
export interface HttpClientOptions {
  /** A bearer token, sent as `Authorization: Bearer TOKEN` (PROTOCOL §1). */
  readonly token?: string | undefined
  /** Default: the global `fetch`. */
  readonly fetch?: typeof fetch | undefined
  /** Per request; default 10 s. */
  readonly timeoutMs?: number | undefined
}

/** Which pools to ask: a model in a namespace, or one serving endpoint (`ns.component.endpoint`). */
export type QueryTarget =
  | { readonly namespace: string; readonly model: string }
  | { readonly servingEndpoint: string }

/** The prompt: tokens (with the adapter and cache salt), or local block hashes already salted. */
export type QueryPrompt =
  | {
      readonly tokens: ReadonlyArray<number>
      readonly loraName?: string | undefined
      readonly cacheSalt?: string | undefined
    }
  | { readonly localBlockHashes: ReadonlyArray<bigint> }

/** `POST /v1/query`'s body (PROTOCOL §5.1 ◆3): which pools to ask and the prompt. */
export type WorkerQuery = QueryTarget & QueryPrompt

/** One pool's answer of `POST /v1/query`; `poolId` is the pool identity document (§5). */
export interface PoolWorkers extends PoolWorkersAnswer {
  readonly servingEndpoint: string
  readonly poolId: unknown
  readonly kvBlockSize: number
}

/** `POST /v1/query`'s answer: one entry per pool that serves the model (PROTOCOL §5.1 ◆3). */
export interface WorkerQueryResponse {
  readonly pools: ReadonlyArray<PoolWorkers>
}

/** The model part of a `POST /query` or `POST /query_by_hash` body (PROTOCOL §5.1 ◆3). */
export interface DynamoQuery {
  readonly modelName: string
  /** The namespace; may be left out when one namespace serves the model. */
  readonly routingGroup?: string | undefined
}

/** One worker of `GET /workers`: its ranks' event source endpoints, by dp rank (PROTOCOL §5.1 ◆3). */
export interface DynamoWorker {
  readonly instance_id: bigint
  readonly endpoints: Readonly<Record<string, string>>
}

/** `POST /v1/overlap` (PROTOCOL §7): one entry per ready lane of every matching domain. */
export interface OverlapResult {
  readonly relay: string
  readonly lane: number
  readonly poolId: unknown
  readonly servingEndpoint: {
    readonly namespace: string
    readonly component: string
    readonly endpoint: string
  }
  readonly prefixDepth: number
  readonly matchedTokens: number
}

/** One half of an indexer domain, as `/v1/domains` lists it. */
interface DomainPart {
  readonly digest: string
  readonly source: "default_derived" | "explicit"
}

type OverlapPrompt =
  | { readonly tokens: ReadonlyArray<number>; readonly loraName?: string | undefined }
  | { readonly localBlockHashes: ReadonlyArray<bigint> }

/** `POST /v1/overlap`'s body: a model in a namespace, or a pool domain, and the prompt. */
export type OverlapQuery =
  | ({ readonly namespace: string; readonly model: string } & OverlapPrompt)
  | ({
      readonly poolDomain: { readonly cacheSemantics: DomainPart; readonly routingScope: DomainPart }
    } & OverlapPrompt)

/** JSON text with every bigint written as a decimal string (the contract's u64 convention). */
const toJson = (value: unknown): string =>
  JSON.stringify(value, (_key, v: unknown) => (typeof v === "bigint" ? v.toString() : v))

/** Reads a JSON answer, keeping integers beyond 2^53 (`instance_id`) exact as bigints. */
const parseWorkers = (text: string): Array<DynamoWorker> => {
  const quoted = text.replace(/"instance_id":(-?\d+)/g, '"instance_id":"$1"')
  const parsed = JSON.parse(quoted) as Array<{ instance_id: string; endpoints: Record<string, string> }>
  return parsed.map((w) => ({ instance_id: BigInt(w.instance_id), endpoints: w.endpoints }))
}

class JsonHttp {
  private readonly base: string
  constructor(
    base: string,
    private readonly options: HttpClientOptions
  ) {
    this.base = base.replace(/\/+$/, "")
  }

  async request(method: "GET" | "POST", path: string, body?: string): Promise<string> {
    const doFetch = this.options.fetch ?? fetch
    const headers: Record<string, string> = {}
    if (body !== undefined) headers["content-type"] = "application/json"
    if (this.options.token !== undefined) headers.authorization = `Bearer ${this.options.token}`
    const response = await doFetch(`${this.base}${path}`, {
      method,
      headers,
      ...(body === undefined ? {} : { body }),
      signal: AbortSignal.timeout(this.options.timeoutMs ?? 10_000)
    })
    const text = await response.text()
    if (response.status < 200 || response.status > 299) {
      let parsed: unknown = text
      try {
        parsed = JSON.parse(text)
      } catch {
        // Not JSON: keep the text.
      }
      throw new KvrelayHttpError(response.status, parsed, `${method} ${path}`)
    }
    return text
  }
}

/** A relay's worker-level query routes. */
export class RelayQueryClient {
  private readonly http: JsonHttp
  constructor(baseUrl: string, options: HttpClientOptions = {}) {
    this.http = new JsonHttp(baseUrl, options)
  }

  /** `POST /v1/query`: every member of each pool serving the model, by device, host and disk depth. */
  async query(query: WorkerQuery): Promise<WorkerQueryResponse> {
    return JSON.parse(await this.http.request("POST", "/v1/query", toJson(query))) as WorkerQueryResponse
  }

  /** `POST /query` (Dynamo's standalone indexer): by tokens, in tokens. */
  async dynamoQuery(
    query: DynamoQuery & {
      readonly tokenIds: ReadonlyArray<number>
      readonly loraName?: string | undefined
      readonly cacheSalt?: string | undefined
    }
  ): Promise<DynamoScoreResponse> {
    const body = {
      token_ids: query.tokenIds,
      model_name: query.modelName,
      ...(query.routingGroup === undefined ? {} : { routing_group: query.routingGroup }),
      ...(query.loraName === undefined ? {} : { lora_name: query.loraName }),
      ...(query.cacheSalt === undefined ? {} : { cache_salt: query.cacheSalt })
    }
    return JSON.parse(await this.http.request("POST", "/query", JSON.stringify(body))) as DynamoScoreResponse
  }

  /** `POST /query_by_hash`: by local block hashes (already salted), sent as exact i64 numbers. */
  async dynamoQueryByHash(
    query: DynamoQuery & { readonly blockHashes: ReadonlyArray<bigint> }
  ): Promise<DynamoScoreResponse> {
    const hashes = query.blockHashes.map((h) => BigInt.asIntN(64, h).toString()).join(",")
    const group =
      query.routingGroup === undefined ? "" : `,"routing_group":${JSON.stringify(query.routingGroup)}`
    const body = `{"model_name":${JSON.stringify(query.modelName)}${group},"block_hashes":[${hashes}]}`
    return JSON.parse(await this.http.request("POST", "/query_by_hash", body)) as DynamoScoreResponse
  }

  /** `GET /workers`: each worker's ranks and their event sources. */
  async workers(
    filter: { readonly modelName?: string; readonly routingGroup?: string } = {}
  ): Promise<Array<DynamoWorker>> {
    const params = new URLSearchParams()
    if (filter.modelName !== undefined) params.set("model_name", filter.modelName)
    if (filter.routingGroup !== undefined) params.set("routing_group", filter.routingGroup)
    const query = params.size === 0 ? "" : `?${params.toString()}`
    return parseWorkers(await this.http.request("GET", `/workers${query}`))
  }
}

/** The global consumer's overlap route. */
export class GlobalOverlapClient {
  private readonly http: JsonHttp
  constructor(baseUrl: string, options: HttpClientOptions = {}) {
    this.http = new JsonHttp(baseUrl, options)
  }

  /** `POST /v1/overlap`: per ready lane, how deep it holds the prompt, deepest first. */
  async overlap(query: OverlapQuery): Promise<ReadonlyArray<OverlapResult>> {
    const text = await this.http.request("POST", "/v1/overlap", toJson(query))
    return (JSON.parse(text) as { results: ReadonlyArray<OverlapResult> }).results
  }
}
