/**
 * What kvrelay's two servers take from an `HttpApi` declaration of their routes (`RelayHttpApi`,
 * `GlobalHttpApi`): the route table they dispatch by, and the OpenAPI document they serve at
 * `GET /v1/openapi.json`. The servers themselves stay hand-written (docs/decisions.md, "Layout"):
 * the contract fixes error bodies and statuses that the platform's API builder words otherwise.
 */

import type * as HttpApi from "@effect/platform/HttpApi"
import type * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import type * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as OpenApi from "@effect/platform/OpenApi"

/** The names of an API's endpoints (`"health" | "catalog" | …`). */
export type RouteName<Api> =
  Api extends HttpApi.HttpApi<string, infer Groups, infer _E, infer _R>
    ? HttpApiEndpoint.HttpApiEndpoint.Name<HttpApiGroup.HttpApiGroup.Endpoints<Groups>>
    : never

/** One route of an API: its endpoint's name, method and path. */
interface Route<Name extends string> {
  readonly name: Name
  readonly method: string
  /** The path as declared (`/v1/endpoints/:endpoint/snapshot`). */
  readonly path: string
  /** The path as documents and spans name it (`/v1/endpoints/{endpoint}/snapshot`). */
  readonly template: string
  /** The path's parameters from a request path, in order, or undefined when it does not match. */
  readonly match: (path: string) => ReadonlyArray<string> | undefined
}

const escapeRegExp = (text: string): string => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")

/** Every route of `api`, in declaration order. */
export const routesOf = <Api extends HttpApi.HttpApi.Any>(api: Api): ReadonlyArray<Route<RouteName<Api>>> => {
  const out: Array<Route<RouteName<Api>>> = []
  for (const group of Object.values((api as unknown as HttpApi.HttpApi.AnyWithProps).groups))
    for (const endpoint of Object.values(group.endpoints)) {
      const path = endpoint.path
      const template = path.replace(/:(\w+)/g, "{$1}")
      const params = path.includes(":")
      const pattern = new RegExp(`^${path.split(/:\w+/).map(escapeRegExp).join("([^/]+)")}$`)
      out.push({
        name: endpoint.name as RouteName<Api>,
        method: endpoint.method,
        path,
        template,
        match: params
          ? (candidate) => pattern.exec(candidate)?.slice(1)
          : (candidate) => (candidate === path ? [] : undefined)
      })
    }
  return out
}

const PLATFORM_DECODE_ERROR = "#/components/schemas/HttpApiDecodeError"

/**
 * The OpenAPI document of one of kvrelay's APIs. The platform declares its own 400 body
 * (`HttpApiDecodeError`) on every API; kvrelay's servers answer a bad request with the contract's
 * `{reason, message}` instead, so that body is dropped, with the components only it used.
 */
export const openApiDocument = (api: HttpApi.HttpApi.Any): OpenApi.OpenAPISpec => {
  const spec = structuredClone(OpenApi.fromApi(api as unknown as HttpApi.HttpApi.AnyWithProps))
  for (const operations of Object.values(spec.paths))
    for (const operation of Object.values(operations) as Array<OpenApi.OpenAPISpecOperation>) {
      const responses = operation.responses as Record<string, OpenApi.OpenApiSpecResponse>
      const response = responses["400"]
      if (response === undefined) continue
      const contents = (response.content ?? {}) as Record<string, { schema: unknown }>
      for (const [type, content] of Object.entries(contents)) {
        const schema = content.schema as { $ref?: string; anyOf?: Array<{ $ref?: string }> }
        const kept = schema.anyOf?.filter((member) => member.$ref !== PLATFORM_DECODE_ERROR) ?? []
        if (schema.$ref === PLATFORM_DECODE_ERROR) delete contents[type]
        else if (kept.length !== (schema.anyOf?.length ?? 0))
          content.schema = kept.length === 1 ? kept[0] : { anyOf: kept }
      }
      if (Object.keys(contents).length === 0) delete responses["400"]
      else response.description = "Error"
    }
  // Components reachable from the paths, following references between components.
  const schemas = spec.components.schemas
  const reachable = new Set<string>()
  const visit = (text: string) => {
    for (const [, name] of text.matchAll(/"#\/components\/schemas\/([^"]+)"/g)) {
      if (reachable.has(name!) || schemas[name!] === undefined) continue
      reachable.add(name!)
      visit(JSON.stringify(schemas[name!]))
    }
  }
  visit(JSON.stringify(spec.paths))
  for (const name of Object.keys(schemas)) if (!reachable.has(name)) delete schemas[name]
  return spec
}
