/**
 * Serving topology and readiness (relay-service §6): the shared evaluator (§6.1) rule by rule,
 * the projection (§6.2) over memberships projected from real cards, and the publisher.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, SubscriptionRef } from "effect"
import { DcCkfFormatIdentity, DcId, PoolId, ProducerIdentity } from "../../src/ckf/identity.js"
import { WATCH_ALL } from "../../src/discovery/DiscoveryConfig.js"
import {
  type DcMembershipView,
  type EndpointMembership,
  emptyMembershipView,
  type WorkerTopology
} from "../../src/discovery/Membership.js"
import { projectMembership } from "../../src/discovery/MembershipProjection.js"
import { decodeJson, encodeJson } from "../../src/protocol/Json.js"
import { type DcPoolDescriptor, modelAlias, withTarget } from "../../src/protocol/Model.js"
import { ReadinessJson } from "../../src/protocol/RelayApi.js"
import { DcPoolCatalog } from "../../src/relay/PoolCatalog.js"
import {
  availabilityFromMembership,
  type EndpointAvailability,
  evaluateReadiness,
  make as makeTopology,
  nextTopologySnapshot,
  projectTopology,
  type ReadinessUnit,
  type TopologySnapshot
} from "../../src/relay/Topology.js"
import { type CardSpec, card } from "../discovery/fixtures.js"
import { relayIdentity } from "./registryFixtures.js"

const unit = (
  workerType: ReadinessUnit["workerType"],
  liveCount: number,
  needs: ReadinessUnit["needs"] = []
): ReadinessUnit => ({ workerType, liveCount, needs })

const viewOf = (specs: ReadonlyArray<CardSpec>): DcMembershipView =>
  projectMembership(specs.map(card), { scope: WATCH_ALL }).view

const emptyCatalog = () => DcPoolCatalog.empty(relayIdentity())

const FORMAT = new DcCkfFormatIdentity(0x5deece66d1b54a33n, 16)

/** The descriptor the host would publish for exactly this membership. */
const descriptorFor = (membership: EndpointMembership, generation = 1n): DcPoolDescriptor => ({
  producer: new ProducerIdentity(new PoolId(membership.domain!.id, new DcId(3n)), 7n, generation, FORMAT),
  servingEndpoint: membership.endpoint,
  registrations: membership.registrations,
  querySemantics: membership.domain!.querySemantics,
  poolRoles: membership.roles
})

const catalogOf = (...descriptors: ReadonlyArray<DcPoolDescriptor>): DcPoolCatalog =>
  descriptors.reduce((catalog, d, i) => catalog.upsert(BigInt(i + 1), d), emptyCatalog())

const project = (
  view: DcMembershipView,
  catalog = emptyCatalog(),
  availability: EndpointAvailability = availabilityFromMembership(view)
) => projectTopology(view, catalog, availability)

const withTopology = (
  view: DcMembershipView,
  endpoint: string,
  topology: ReadonlyArray<[string, WorkerTopology]>
): DcMembershipView => {
  const endpoints = new Map(view.endpoints)
  endpoints.set(endpoint, { ...view.endpoints.get(endpoint)!, workerTopology: new Map(topology) })
  return { endpoints }
}

describe("evaluate_readiness (§6.1)", () => {
  it("an empty unit list is not ready", () => {
    expect(evaluateReadiness([])).toEqual({
      ready: false,
      present: [],
      missing: [],
      ambiguous: [],
      hasLegacy: false
    })
  })

  it("step 1: present roles are the typed roles with a live worker, sorted", () => {
    const evaluation = evaluateReadiness([unit("decode", 1), unit("prefill", 2), unit("encode", 0)])
    expect(evaluation.present).toEqual(["prefill", "decode"])
  })

  it("step 2: a legacy unit takes the compatibility branch: ready iff anything is live", () => {
    expect(evaluateReadiness([unit(null, 1), unit("prefill", 0)])).toEqual({
      ready: true,
      present: [],
      missing: [],
      ambiguous: [],
      hasLegacy: true
    })
    expect(evaluateReadiness([unit(null, 0)]).ready).toBe(false)
    // A dead legacy unit still selects the branch; a live typed unit makes it ready.
    const mixed = evaluateReadiness([unit(null, 0), unit("decode", 1), unit("decode", 1)])
    expect(mixed).toMatchObject({ ready: true, hasLegacy: true, missing: [], ambiguous: [] })
  })

  it("step 3: non-aggregated roles with more than one live unit are ambiguous, without gating readiness", () => {
    const evaluation = evaluateReadiness([
      unit("prefill", 1),
      unit("prefill", 1),
      unit("decode", 1),
      unit("aggregated", 1),
      unit("aggregated", 3),
      unit("encode", 1),
      unit("encode", 1)
    ])
    expect(evaluation.ambiguous).toEqual(["prefill", "encode"])
    expect(evaluation.ready).toBe(true)
    // One unit with many live workers is scale-out, not ambiguity; dead units do not count.
    expect(evaluateReadiness([unit("prefill", 5), unit("prefill", 0)]).ambiguous).toEqual([])
  })

  it("step 4: a declared role without a live worker is missing", () => {
    const evaluation = evaluateReadiness([unit("prefill", 1), unit("decode", 0)])
    expect(evaluation.missing).toEqual(["decode"])
    expect(evaluation.ready).toBe(false)
    // A dead unit whose role another unit makes present is not missing.
    expect(evaluateReadiness([unit("decode", 0), unit("decode", 1)]).missing).toEqual([])
  })

  it("step 4: a live unit's unsatisfied needs add every needed role not present", () => {
    const needy = evaluateReadiness([unit("prefill", 1, [["decode", "encode"]])])
    expect(needy.missing).toEqual(["decode", "encode"])
    // Any satisfied alternative is enough.
    const alternatives = evaluateReadiness([
      unit("prefill", 1, [["decode"], ["aggregated"]]),
      unit("aggregated", 1)
    ])
    expect(alternatives).toMatchObject({ ready: true, missing: [] })
    // Needs of a dead unit are ignored (its own role still counts as missing).
    expect(evaluateReadiness([unit("prefill", 0, [["decode"]]), unit("aggregated", 1)]).missing).toEqual([
      "prefill"
    ])
  })

  it("step 5: ready needs a live worker and nothing missing", () => {
    expect(evaluateReadiness([unit("aggregated", 0)]).ready).toBe(false)
    expect(evaluateReadiness([unit("aggregated", 1)]).ready).toBe(true)
  })
})

describe("topology projection (§6.2)", () => {
  it("groups endpoints by (namespace, base model); members sorted by endpoint, entries by key", () => {
    const view = viewOf([
      { endpoint: "prod.zeta.generate", worker: 1, name: "llama" },
      { endpoint: "prod.alpha.generate", worker: 2, name: "llama" },
      { endpoint: "prod.beta.generate", worker: 3, name: "gemma" },
      { endpoint: "dev.alpha.generate", worker: 4, name: "llama" }
    ])
    const { entries } = project(view)
    expect(entries.map((e) => [e.namespace, e.canonicalModelId])).toEqual([
      ["dev", "llama"],
      ["prod", "gemma"],
      ["prod", "llama"]
    ])
    const llama = entries[2]!
    expect(llama.members.map((m) => m.endpoint.toString())).toEqual([
      "prod.alpha.generate",
      "prod.zeta.generate"
    ])
    expect(llama).toMatchObject({
      state: "READY",
      presentRoles: ["aggregated"],
      missingRoles: [],
      duplicateRoleEndpoints: [],
      legacyFallbackActive: false,
      adapters: []
    })
    expect(llama.members[0]!.roles).toEqual(["aggregated"])
  })

  it("an endpoint with a ServingTopology conflict is not a member", () => {
    const view = viewOf([
      { endpoint: "prod.mixed.generate", worker: 1, name: "llama" },
      { endpoint: "prod.mixed.generate", worker: 2, name: "gemma" },
      { endpoint: "prod.clean.generate", worker: 3, name: "llama" }
    ])
    const { entries } = project(view)
    expect(entries).toHaveLength(1)
    expect(entries[0]!.members.map((m) => m.endpoint.toString())).toEqual(["prod.clean.generate"])
  })

  it("authority: an endpoint without availability makes its group UNKNOWN with roles cleared", () => {
    const view = viewOf([
      { endpoint: "prod.a.generate", worker: 1, workerType: "prefill" },
      { endpoint: "prod.b.generate", worker: 2, workerType: "decode" }
    ])
    const partial = new Map(availabilityFromMembership(view))
    partial.set("prod.b.generate", undefined)
    const [entry] = project(view, emptyCatalog(), partial).entries
    expect(entry).toMatchObject({ state: "UNKNOWN", presentRoles: [], missingRoles: [] })
    expect(entry!.members).toHaveLength(2)
  })

  it("units count only live workers: a dead role is missing and the entry UNAVAILABLE", () => {
    const view = viewOf([
      { endpoint: "prod.p.generate", worker: 1, workerType: "prefill" },
      { endpoint: "prod.d.generate", worker: 2, workerType: "decode" },
      { endpoint: "prod.d.generate", worker: 3, workerType: "decode" }
    ])
    const ready = project(view).entries[0]!
    expect(ready).toMatchObject({ state: "READY", presentRoles: ["prefill", "decode"], missingRoles: [] })
    const availability = new Map(availabilityFromMembership(view))
    availability.set("prod.d.generate", new Set())
    const down = project(view, emptyCatalog(), availability).entries[0]!
    expect(down).toMatchObject({ state: "UNAVAILABLE", presentRoles: ["prefill"], missingRoles: ["decode"] })
  })

  it("needs of the workers' topology feed the evaluator", () => {
    const view = viewOf([{ endpoint: "prod.p.generate", worker: 1, workerType: "prefill" }])
    const needy = withTopology(view, "prod.p.generate", [
      ["1", { workerType: "prefill", modelType: null, needs: [["decode"]] }]
    ])
    expect(project(needy).entries[0]).toMatchObject({ state: "UNAVAILABLE", missingRoles: ["decode"] })
  })

  it("legacy workers select the compatibility branch and are reported", () => {
    const view = viewOf([
      { endpoint: "prod.old.generate", worker: 1, workerType: null },
      { endpoint: "prod.new.generate", worker: 2, workerType: "prefill" }
    ])
    const entry = project(view).entries[0]!
    expect(entry).toMatchObject({ state: "READY", legacyFallbackActive: true, missingRoles: [] })
    expect(entry.members.find((m) => m.endpoint.toString() === "prod.old.generate")!.roles).toEqual([
      "legacy"
    ])
  })

  it("duplicate prefill/decode endpoints are listed without gating; encode duplicates are not emitted", () => {
    const view = viewOf([
      { endpoint: "prod.p1.generate", worker: 1, workerType: "prefill" },
      { endpoint: "prod.p2.generate", worker: 2, workerType: "prefill" },
      { endpoint: "prod.d.generate", worker: 3, workerType: "decode" },
      { endpoint: "prod.e1.generate", worker: 4, workerType: "encode" },
      { endpoint: "prod.e2.generate", worker: 5, workerType: "encode" },
      { endpoint: "prod.a1.generate", worker: 6, workerType: "aggregated" },
      { endpoint: "prod.a2.generate", worker: 7, workerType: "aggregated" }
    ])
    const entry = project(view).entries[0]!
    expect(entry.state).toBe("READY")
    expect(entry.duplicateRoleEndpoints).toEqual(["prefill"])
  })

  describe("member pool ids", () => {
    const view = viewOf([{ endpoint: "prod.backend.generate", worker: 1, aliases: ["chat"] }])
    const membership = view.endpoints.get("prod.backend.generate")!
    const poolIdOf = (catalog: DcPoolCatalog, v: DcMembershipView = view) =>
      project(v, catalog).entries[0]!.members[0]!.poolId

    it("are set when the catalog pool was published for exactly this membership", () => {
      const descriptor = descriptorFor(membership)
      expect(poolIdOf(catalogOf(descriptor))!.equals(descriptor.producer.poolId)).toBe(true)
      expect(poolIdOf(emptyCatalog())).toBeUndefined()
    })

    it("are absent when registrations, roles, semantics or domain differ", () => {
      const base = descriptorFor(membership)
      const registration = membership.registrations[0]!
      const otherAliases = withTarget(registration.model, registration.target, [modelAlias("assistant")])
      expect(poolIdOf(catalogOf({ ...base, registrations: [otherAliases] }))).toBeUndefined()
      expect(poolIdOf(catalogOf({ ...base, poolRoles: ["prefill"] }))).toBeUndefined()
      const otherSemantics = viewOf([
        { endpoint: "prod.backend.generate", worker: 1, aliases: ["chat"], blockSize: 32 }
      ])
      const stale = descriptorFor(otherSemantics.endpoints.get("prod.backend.generate")!)
      expect(poolIdOf(catalogOf(stale))).toBeUndefined()
      const otherDomain = viewOf([
        { endpoint: "prod.backend.generate", worker: 1, aliases: ["chat"], sourcePath: "meta/other" }
      ])
      expect(
        poolIdOf(catalogOf(descriptorFor(otherDomain.endpoints.get("prod.backend.generate")!)))
      ).toBeUndefined()
    })

    it("are absent when two catalog pools claim the same endpoint and base model", () => {
      const first = descriptorFor(membership)
      const clash = viewOf([
        { endpoint: "prod.backend.generate", worker: 1, aliases: ["chat"], sourcePath: "x/y" }
      ])
      const second = descriptorFor(clash.endpoints.get("prod.backend.generate")!, 2n)
      const projection = project(view, catalogOf(first, second))
      expect(projection.entries[0]!.members[0]!.poolId).toBeUndefined()
      expect(projection.conflictingLinks).toEqual(["prod.backend.generate llama"])
    })

    it("are absent while the membership is not materializable", () => {
      const conflicted: DcMembershipView = {
        endpoints: new Map([
          [
            membership.key,
            {
              ...membership,
              conflicts: [
                {
                  scope: "PoolMaterialization",
                  subject: { _tag: "Worker", workerId: "1" },
                  reason: "x",
                  text: "x"
                }
              ]
            }
          ]
        ])
      }
      expect(poolIdOf(catalogOf(descriptorFor(membership)), conflicted)).toBeUndefined()
    })
  })

  it("adapters are nested under their base model with their own state and authority", () => {
    const view = viewOf([
      { endpoint: "prod.backend.generate", worker: 1 },
      {
        endpoint: "prod.backend.generate",
        worker: 1,
        suffix: "tenant-a",
        name: "tenant-a",
        lora: { name: "lora-a" }
      },
      { endpoint: "prod.backend.generate", worker: 2 }
    ])
    const { entries } = project(view)
    // LoRA adapters never become top-level entries.
    expect(entries).toHaveLength(1)
    expect(entries[0]!.adapters).toEqual([{ canonicalModelId: "tenant-a", state: "READY", missingRoles: [] }])
    // Only worker 2 is live: the base stays READY, the adapter (served by worker 1 only) is not.
    const availability = new Map([["prod.backend.generate", new Set(["2"])]])
    const degraded = project(view, emptyCatalog(), availability).entries[0]!
    expect(degraded.state).toBe("READY")
    expect(degraded.adapters).toEqual([
      { canonicalModelId: "tenant-a", state: "UNAVAILABLE", missingRoles: ["aggregated"] }
    ])
    const unknown = project(view, emptyCatalog(), new Map([["prod.backend.generate", undefined]])).entries[0]!
    expect(unknown.adapters).toEqual([{ canonicalModelId: "tenant-a", state: "UNKNOWN", missingRoles: [] }])
  })

  it("the revision grows by one only when the entries change", () => {
    const view = viewOf([{ endpoint: "prod.backend.generate", worker: 1 }])
    const initial: TopologySnapshot = { revision: 1n, entries: [] }
    const changed = nextTopologySnapshot(initial, project(view).entries)
    expect(changed.revision).toBe(2n)
    expect(
      nextTopologySnapshot(
        changed,
        project(viewOf([{ endpoint: "prod.backend.generate", worker: 1 }])).entries
      )
    ).toBe(changed)
  })

  it("encodes as the readiness document with camelCase names and u64 strings", () => {
    const view = viewOf([{ endpoint: "prod.backend.generate", worker: 1 }])
    const descriptor = descriptorFor(view.endpoints.get("prod.backend.generate")!)
    const snapshot: TopologySnapshot = { revision: 4n, entries: project(view, catalogOf(descriptor)).entries }
    const json = Either.getOrThrow(encodeJson(ReadinessJson)(snapshot)) as {
      revision: string
      entries: Array<object>
    }
    expect(json.revision).toBe("4")
    expect(json.entries[0]).toMatchObject({
      namespace: "prod",
      canonicalModelId: "llama",
      state: "READY",
      members: [
        {
          endpoint: { namespace: "prod", component: "backend", endpoint: "generate" },
          roles: ["aggregated"],
          poolId: { identityVersion: 1, dcId: "0000000000000003" }
        }
      ]
    })
    expect(Either.isRight(decodeJson(ReadinessJson)(JSON.parse(JSON.stringify(json))))).toBe(true)
  })
})

describe("TopologyPublisher", () => {
  it.scoped("follows memberships and the catalog, bumping the revision only on change", () =>
    Effect.gen(function* () {
      const membershipRef = yield* SubscriptionRef.make<DcMembershipView>(emptyMembershipView)
      const catalogRef = yield* SubscriptionRef.make(emptyCatalog())
      const publisher = yield* makeTopology({ membershipRef, catalogRef })
      const settle = Effect.gen(function* () {
        for (let i = 0; i < 50; i++) yield* Effect.yieldNow()
      })
      yield* settle
      expect(yield* publisher.current).toEqual({ revision: 1n, entries: [] })

      const view = viewOf([{ endpoint: "prod.backend.generate", worker: 1 }])
      yield* SubscriptionRef.set(membershipRef, view)
      yield* settle
      const second = yield* publisher.current
      expect(second.revision).toBe(2n)
      expect(second.entries[0]!.members[0]!.poolId).toBeUndefined()

      // An equal view (new objects) changes nothing.
      yield* SubscriptionRef.set(membershipRef, viewOf([{ endpoint: "prod.backend.generate", worker: 1 }]))
      yield* settle
      expect((yield* publisher.current).revision).toBe(2n)

      // The matching pool appears in the catalog: the member gets its pool id.
      const descriptor = descriptorFor(view.endpoints.get("prod.backend.generate")!)
      yield* SubscriptionRef.set(catalogRef, catalogOf(descriptor))
      yield* settle
      const third = yield* publisher.current
      expect(third.revision).toBe(3n)
      expect(third.entries[0]!.members[0]!.poolId!.equals(descriptor.producer.poolId)).toBe(true)

      // A catalog revision that does not touch any entry keeps the topology revision.
      yield* SubscriptionRef.set(catalogRef, catalogOf(descriptor).upsert(9n, descriptor))
      yield* settle
      expect((yield* publisher.current).revision).toBe(3n)

      // The endpoint leaves discovery: its entry disappears.
      yield* SubscriptionRef.set(membershipRef, emptyMembershipView)
      yield* settle
      expect(yield* publisher.current).toEqual({ revision: 4n, entries: [] })
    })
  )
})
