import { describe, expect, it } from "@effect/vitest"
import * as fc from "fast-check"
import {
  type DiscoveryScope,
  endpointMatchesPrefix,
  scopeMatches,
  validateDiscoveryScope,
  WATCH_ALL
} from "../../src/discovery/DiscoveryConfig.js"
import {
  CONFLICT_REASONS,
  type ConflictScope,
  type DcMembershipView,
  type EndpointMembership,
  hasPoolMaterializationConflict,
  hasServingTopologyConflict,
  isMaterializable,
  type MaterializationConflict
} from "../../src/discovery/Membership.js"
import {
  MembershipProjector,
  membershipEquals,
  projectMembership
} from "../../src/discovery/MembershipProjection.js"
import type { ModelCardInstance } from "../../src/protocol/Discovery.js"
import { type CardSpec, card, endpoint } from "./fixtures.js"

const GENERATE = "prod.backend.generate"

const project = (cards: ReadonlyArray<ModelCardInstance>, scope: DiscoveryScope = WATCH_ALL) =>
  projectMembership(cards, { scope }).view

const membershipOf = (view: DcMembershipView, key = GENERATE): EndpointMembership => {
  const membership = view.endpoints.get(key)
  if (membership === undefined) throw new Error(`no membership for ${key}`)
  return membership
}

const conflictsOf = (
  membership: EndpointMembership,
  scope?: ConflictScope
): ReadonlyArray<MaterializationConflict> =>
  membership.conflicts.filter((c) => scope === undefined || c.scope === scope)

const subjectOf = (conflict: MaterializationConflict): string => conflict.text.split(" ")[1]!

describe("identity vectors through the projection (PROTOCOL §2)", () => {
  it("prod.router.generate, meta/llama, block size 512 resolves the verified domain", () => {
    const view = project([
      card({ endpoint: "prod.router.generate", sourcePath: "meta/llama", blockSize: 512 })
    ])
    const membership = membershipOf(view, "prod.router.generate")
    expect(membership.domain?.id.cacheSemantics.hex).toBe("7d31eb9019357572470605f4a8be687e")
    expect(membership.domain?.id.routingScope.hex).toBe("18270d3ba03effaec8d167ba02c7752d")
    expect(membership.domain?.id.cacheSemantics.source).toBe("default_derived")
    expect(membership.domain?.id.routingScope.source).toBe("default_derived")
    expect(membership.domain?.querySemantics.kvBlockSize).toBe(512)
    expect(membership.domain?.querySemantics.hashFormat).toBe("dynamo_standard_v1")
    expect(isMaterializable(membership)).toBe(true)
  })

  it("eagle selects dynamo_eagle_v1 and changes the cache semantics, not the routing scope", () => {
    const standard = membershipOf(
      project([card({ endpoint: "prod.router.generate", blockSize: 512 })]),
      "prod.router.generate"
    )
    const eagle = membershipOf(
      project([card({ endpoint: "prod.router.generate", blockSize: 512, runtime: { enableEagle: true } })]),
      "prod.router.generate"
    )
    expect(eagle.domain?.querySemantics.hashFormat).toBe("dynamo_eagle_v1")
    expect(eagle.domain?.id.cacheSemantics.hex).not.toBe(standard.domain?.id.cacheSemantics.hex)
    expect(eagle.domain?.id.routingScope.hex).toBe("18270d3ba03effaec8d167ba02c7752d")
  })

  it("explicit identity maps give explicit sources", () => {
    const membership = membershipOf(
      project([card({ indexerIdentity: { semantics: { model: "llama-3" }, routingScope: { pool: "a" } } })])
    )
    expect(membership.domain?.id.cacheSemantics.source).toBe("explicit")
    expect(membership.domain?.id.routingScope.source).toBe("explicit")
  })
})

describe("membership fields (§2.3)", () => {
  it("collects registrations, models, aliases, roles, runtime configs and topology per worker", () => {
    const view = project([
      card({ worker: 2, aliases: ["instruct", "chat", "chat", "llama"], workerType: "decode" }),
      card({ worker: 1, aliases: ["chat"], workerType: "prefill", runtime: { dataParallelSize: 2 } }),
      card({ worker: 3, workerType: null })
    ])
    const membership = membershipOf(view)
    expect(membership.namespace).toBe("prod")
    expect(membership.registrations).toHaveLength(1)
    expect(membership.registrations[0]!.model).toBe("llama")
    expect(membership.registrations[0]!.target).toMatchObject({ _tag: "Base", baseModel: "llama" })
    expect(membership.registrations[0]!.aliases).toEqual(["chat", "instruct"])
    expect(membership.models).toEqual(["llama"])
    expect(membership.aliases).toEqual(["chat", "instruct"])
    expect(membership.roles).toEqual(["prefill", "decode", "legacy"])
    expect([...membership.runtimeConfigs.keys()].sort()).toEqual(["1", "2", "3"])
    expect(membership.runtimeConfigs.get("1")!.dataParallelSize).toBe(2)
    expect(membership.workerTopology.get("3")).toEqual({ workerType: null, modelType: null, needs: [] })
    expect(membership.conflicts).toEqual([])
    expect(isMaterializable(membership)).toBe(true)
  })

  it("an adapter card overlays its worker's base card: Lora registration and adapter workers", () => {
    const view = project([
      card({ worker: 1 }),
      card({
        worker: 1,
        suffix: "tenant-a",
        name: "tenant-a",
        lora: { name: "tenant-a", maxGpuLoraCount: 4 }
      }),
      card({ worker: 2 }),
      card({
        worker: 2,
        suffix: "tenant-a",
        name: "tenant-a",
        lora: { name: "tenant-a", maxGpuLoraCount: 4 }
      })
    ])
    const membership = membershipOf(view)
    expect(isMaterializable(membership)).toBe(true)
    expect(membership.models).toEqual(["llama", "tenant-a"])
    expect(membership.runtimeConfigs.size).toBe(2)
    const lora = membership.registrations.find((r) => r.model === "tenant-a")!
    expect(lora.target).toMatchObject({ _tag: "Lora", baseModel: "llama", adapter: "tenant-a" })
    const overlay = membership.adapters.get("tenant-a" as never)!
    expect(overlay.baseModel).toBe("llama")
    expect([...overlay.workers.entries()]).toEqual([
      ["1", { maxGpuLoraCount: 4 }],
      ["2", { maxGpuLoraCount: 4 }]
    ])
  })

  it("the request-facing adapter name is distinct from the runtime LoRA identity", () => {
    const membership = membershipOf(
      project([
        card({ worker: 1 }),
        card({
          worker: 1,
          suffix: "adapter-v2",
          name: "tenant-chat",
          lora: { name: "org/runtime-adapter-v2" }
        })
      ])
    )
    const overlay = membership.adapters.get("tenant-chat" as never)!
    expect(overlay.adapter).toBe("org/runtime-adapter-v2")
    expect(overlay.workers.get("1")).toEqual({ maxGpuLoraCount: null })
    expect(membership.registrations.find((r) => r.model === "tenant-chat")!.target).toMatchObject({
      _tag: "Lora",
      baseModel: "llama",
      adapter: "org/runtime-adapter-v2"
    })
  })
})

describe("conflict rules (§2.4, §2.5)", () => {
  it("step 2: a suffix without LoRA metadata (or the reverse) is a ServingBinding conflict on the card", () => {
    const membership = membershipOf(
      project([
        card({ worker: 1 }),
        card({ worker: 2, name: "tenant-chat", lora: { name: "runtime-adapter" } }),
        card({ worker: 3, suffix: "tenant-x", name: "tenant-x" })
      ])
    )
    const conflicts = conflictsOf(membership, "ServingBinding")
    expect(conflicts.map((c) => [subjectOf(c), c.reason])).toEqual([
      ["Card(prod/backend/generate/2)", CONFLICT_REASONS.loraMismatch],
      ["Card(prod/backend/generate/3/tenant-x)", CONFLICT_REASONS.loraMismatch]
    ])
    expect(membership.models).toEqual(["llama"])
    expect(membership.adapters.size).toBe(0)
    expect(isMaterializable(membership)).toBe(true)
  })

  it("step 3: an unresolvable domain is a PoolMaterialization conflict on the card; serving facts stay", () => {
    const membership = membershipOf(project([card({ blockSize: 0 })]))
    expect(membership.domain).toBeNull()
    const [conflict] = conflictsOf(membership, "PoolMaterialization")
    expect(subjectOf(conflict!)).toBe("Card(prod/backend/generate/1)")
    expect(conflict!.reason).toBe("kvCacheBlockSize must be greater than zero")
    expect(membership.models).toEqual(["llama"])
    expect(membership.registrations).toHaveLength(1)
    expect(membership.workerTopology.has("1")).toBe(true)
    expect(isMaterializable(membership)).toBe(false)
  })

  it("step 4: one unresolved base card leaves the endpoint without a domain but adds no endpoint conflict", () => {
    const membership = membershipOf(project([card({ worker: 1 }), card({ worker: 2, blockSize: 0 })]))
    expect(membership.domain).toBeNull()
    expect(membership.conflicts.map((c) => c.subject._tag)).toEqual(["Card"])
  })

  it("step 4: more than one distinct domain is a PoolMaterialization conflict on the endpoint", () => {
    const membership = membershipOf(
      project([card({ worker: 1 }), card({ worker: 2, runtime: { enableEagle: true } })])
    )
    expect(membership.domain).toBeNull()
    const [conflict] = conflictsOf(membership)
    expect(conflict!.scope).toBe("PoolMaterialization")
    expect(subjectOf(conflict!)).toBe(`Endpoint(${GENERATE})`)
    expect(conflict!.reason).toBe(CONFLICT_REASONS.multipleDomains)
    expect(hasServingTopologyConflict(membership)).toBe(false)
    expect(isMaterializable(membership)).toBe(false)
  })

  it("step 5: more than one base model is a ServingTopology conflict on the endpoint", () => {
    const membership = membershipOf(project([card({ worker: 1 }), card({ worker: 2, name: "chat" })]))
    expect(membership.domain).not.toBeNull()
    const conflicts = conflictsOf(membership, "ServingTopology")
    expect(conflicts.map((c) => [subjectOf(c), c.reason])).toEqual([
      [`Endpoint(${GENERATE})`, CONFLICT_REASONS.multipleBaseModels]
    ])
    expect(membership.models).toEqual(["chat", "llama"])
    expect(hasServingTopologyConflict(membership)).toBe(true)
    expect(hasPoolMaterializationConflict(membership)).toBe(true)
    expect(isMaterializable(membership)).toBe(false)
  })

  it("step 6: a worker with two base cards is a ServingTopology conflict on the worker and is skipped", () => {
    // Both backends keep one record per card id, so only a direct caller can hand over two base
    // cards of one worker; the rule still holds for them.
    const membership = membershipOf(
      project([card({ worker: 1 }), card({ worker: 1, aliases: ["x"] }), card({ worker: 2 })])
    )
    expect(conflictsOf(membership, "ServingTopology").map((c) => [subjectOf(c), c.reason])).toEqual([
      ["Worker(1)", CONFLICT_REASONS.multipleBaseCards]
    ])
    expect([...membership.runtimeConfigs.keys()]).toEqual(["2"])
    expect(isMaterializable(membership)).toBe(false)
  })

  it("step 6: an invalid base model name is a ServingBinding conflict on the card; its domain still counts", () => {
    const view = projectMembership([card({ worker: 1 }), card({ worker: 2, name: " llama" })], {
      scope: WATCH_ALL
    })
    const membership = membershipOf(view.view)
    expect(conflictsOf(membership).map((c) => [c.scope, subjectOf(c), c.reason])).toEqual([
      ["ServingBinding", "Card(prod/backend/generate/2)", CONFLICT_REASONS.invalidModel]
    ])
    expect(membership.domain).not.toBeNull()
    expect([...membership.runtimeConfigs.keys()]).toEqual(["1"])
    expect(isMaterializable(membership)).toBe(true)
    expect(view.diagnostics.map((d) => d.key)).toEqual(["invalid-model:prod/backend/generate/2"])
  })

  it("step 7: an orphan adapter card is a soft error without a conflict", () => {
    const view = projectMembership(
      [card({ worker: 1 }), card({ worker: 2, suffix: "t", name: "tenant", lora: { name: "tenant" } })],
      { scope: WATCH_ALL }
    )
    const membership = membershipOf(view.view)
    expect(membership.conflicts).toEqual([])
    expect(membership.models).toEqual(["llama"])
    expect(view.diagnostics.map((d) => d.key)).toEqual(["orphan-adapter:prod/backend/generate/2/t"])
  })

  it("step 7: an adapter over an invalid base model is a ServingBinding conflict on the adapter card", () => {
    const membership = membershipOf(
      project([
        card({ worker: 1, name: "llama " }),
        card({ worker: 1, suffix: "t", name: "tenant", lora: { name: "tenant" } })
      ])
    )
    expect(conflictsOf(membership).map((c) => [c.scope, subjectOf(c), c.reason])).toEqual([
      ["ServingBinding", "Card(prod/backend/generate/1)", CONFLICT_REASONS.invalidModel],
      ["ServingBinding", "Card(prod/backend/generate/1/t)", CONFLICT_REASONS.adapterBaseInvalid]
    ])
  })

  it("step 7: an invalid request-facing adapter name is a ServingBinding conflict on the card", () => {
    const membership = membershipOf(
      project([card({ worker: 1 }), card({ worker: 1, suffix: "t", name: "", lora: { name: "tenant" } })])
    )
    expect(conflictsOf(membership).map((c) => [c.scope, subjectOf(c), c.reason])).toEqual([
      ["ServingBinding", "Card(prod/backend/generate/1/t)", CONFLICT_REASONS.adapterServedInvalid]
    ])
    expect(isMaterializable(membership)).toBe(true)
  })

  it("step 7: an invalid runtime LoRA name is a ServingBinding conflict on the card", () => {
    const membership = membershipOf(
      project([
        card({ worker: 1 }),
        card({ worker: 1, suffix: "t", name: "tenant", lora: { name: " tenant" } })
      ])
    )
    expect(conflictsOf(membership).map((c) => [c.scope, subjectOf(c), c.reason])).toEqual([
      ["ServingBinding", "Card(prod/backend/generate/1/t)", CONFLICT_REASONS.adapterRuntimeInvalid]
    ])
  })

  it("step 7: one served adapter name with two runtime targets conflicts on the card and is ambiguous DC-wide", () => {
    const membership = membershipOf(
      project([
        card({ worker: 1 }),
        card({ worker: 1, suffix: "a", name: "tenant", lora: { name: "runtime-a" } }),
        card({ worker: 2 }),
        card({ worker: 2, suffix: "b", name: "tenant", lora: { name: "runtime-b" } })
      ])
    )
    expect(conflictsOf(membership).map((c) => [c.scope, subjectOf(c), c.reason])).toEqual([
      ["ServingBinding", 'Binding("tenant")', CONFLICT_REASONS.ambiguousName],
      ["ServingBinding", "Card(prod/backend/generate/2/b)", CONFLICT_REASONS.adapterConflictingTargets]
    ])
    expect(membership.models).toEqual(["llama"])
    expect(membership.adapters.size).toBe(0)
    expect(isMaterializable(membership)).toBe(true)
  })

  it("step 7: one worker with two capacities is removed and fences the pool (PoolMaterialization on the worker)", () => {
    const membership = membershipOf(
      project([
        card({ worker: 1 }),
        card({ worker: 1, suffix: "a", name: "tenant", lora: { name: "tenant", maxGpuLoraCount: 4 } }),
        card({ worker: 1, suffix: "b", name: "tenant", lora: { name: "tenant", maxGpuLoraCount: 8 } }),
        card({ worker: 2 }),
        card({ worker: 2, suffix: "a", name: "tenant", lora: { name: "tenant", maxGpuLoraCount: 4 } })
      ])
    )
    expect(conflictsOf(membership).map((c) => [c.scope, subjectOf(c), c.reason])).toEqual([
      ["PoolMaterialization", "Worker(1)", CONFLICT_REASONS.adapterCapacity]
    ])
    expect([...membership.adapters.get("tenant" as never)!.workers.keys()]).toEqual(["2"])
    expect(isMaterializable(membership)).toBe(false)
  })

  it("step 8: a name bound to two targets across endpoints is dropped everywhere with a Binding conflict", () => {
    const view = projectMembership(
      [
        card({ endpoint: "prod.backend.chat", name: "chat", sourcePath: "meta/chat" }),
        card({ endpoint: "prod.backend.llama", worker: 2 }),
        card({
          endpoint: "prod.backend.llama",
          worker: 2,
          suffix: "c",
          name: "chat",
          lora: { name: "chat-lora" }
        })
      ],
      { scope: WATCH_ALL }
    )
    const chat = membershipOf(view.view, "prod.backend.chat")
    const llama = membershipOf(view.view, "prod.backend.llama")
    for (const membership of [chat, llama]) {
      expect(conflictsOf(membership).map((c) => [c.scope, subjectOf(c), c.reason])).toEqual([
        ["ServingBinding", 'Binding("chat")', CONFLICT_REASONS.ambiguousName]
      ])
    }
    expect(chat.registrations).toEqual([])
    expect(isMaterializable(chat)).toBe(false)
    expect(llama.models).toEqual(["llama"])
    expect(llama.adapters.size).toBe(0)
    expect(isMaterializable(llama)).toBe(true)
    expect(view.diagnostics.map((d) => d.key)).toContain("ambiguous-name:chat")
  })

  it("step 8: the same base model on two endpoints is one binding, not ambiguous", () => {
    const view = project([card({ endpoint: "prod.backend.a" }), card({ endpoint: "prod.backend.b" })])
    expect(membershipOf(view, "prod.backend.a").conflicts).toEqual([])
    expect(membershipOf(view, "prod.backend.b").conflicts).toEqual([])
  })

  it("step 8: an ambiguous alias is removed silently from every claim", () => {
    const view = project([
      card({ endpoint: "prod.backend.llama", aliases: ["shared-chat", "llama-chat"] }),
      card({
        endpoint: "prod.backend.mistral",
        name: "mistral",
        sourcePath: "mistral/model",
        aliases: ["shared-chat"]
      })
    ])
    const llama = membershipOf(view, "prod.backend.llama")
    const mistral = membershipOf(view, "prod.backend.mistral")
    expect(llama.conflicts).toEqual([])
    expect(mistral.conflicts).toEqual([])
    expect(llama.aliases).toEqual(["llama-chat"])
    expect(mistral.aliases).toEqual([])
    expect(isMaterializable(llama) && isMaterializable(mistral)).toBe(true)
  })

  it("an alias that names another model's binding makes that model ambiguous", () => {
    const view = project([
      card({ endpoint: "prod.backend.llama", aliases: ["mistral"] }),
      card({ endpoint: "prod.backend.mistral", name: "mistral", sourcePath: "mistral/model" })
    ])
    expect(membershipOf(view, "prod.backend.mistral").registrations).toEqual([])
    expect(membershipOf(view, "prod.backend.llama").aliases).toEqual([])
  })

  it("soft errors: invalid aliases and an alias equal to the model are dropped without a conflict", () => {
    const view = projectMembership([card({ aliases: ["", " chat", "llama", "ok"] })], { scope: WATCH_ALL })
    const membership = membershipOf(view.view)
    expect(membership.conflicts).toEqual([])
    expect(membership.aliases).toEqual(["ok"])
    expect(view.diagnostics.map((d) => d.key).sort()).toEqual([
      "invalid-alias:prod/backend/generate/1:",
      "invalid-alias:prod/backend/generate/1: chat"
    ])
  })

  it("conflicts are sorted by their debug text and deduplicated", () => {
    const membership = membershipOf(
      project([
        card({ endpoint: GENERATE, worker: 1, name: "chat", sourcePath: "meta/chat" }),
        card({ endpoint: GENERATE, worker: 2, name: "chat", sourcePath: "meta/chat", blockSize: 0 }),
        card({ endpoint: "prod.backend.other", worker: 3 }),
        card({ endpoint: "prod.backend.other", worker: 3, suffix: "c", name: "chat", lora: { name: "x" } })
      ])
    )
    const texts = membership.conflicts.map((c) => c.text)
    expect(texts).toEqual([...texts].sort())
    expect(new Set(texts).size).toBe(texts.length)
    // Two workers claim the ambiguous "chat": one Binding conflict remains.
    expect(texts.filter((t) => t.includes('Binding("chat")'))).toHaveLength(1)
  })

  it("scopes: only ServingBinding conflicts leave the endpoint materializable", () => {
    const binding = membershipOf(project([card({ worker: 1 }), card({ worker: 2, name: "" })]))
    expect(binding.conflicts.map((c) => c.scope)).toEqual(["ServingBinding"])
    expect(isMaterializable(binding)).toBe(true)
    const pool = membershipOf(project([card({ worker: 1 }), card({ worker: 2, blockSize: 0 })]))
    expect(hasPoolMaterializationConflict(pool) && !hasServingTopologyConflict(pool)).toBe(true)
    const topology = membershipOf(project([card({ worker: 1 }), card({ worker: 2, name: "chat" })]))
    expect(hasServingTopologyConflict(topology) && hasPoolMaterializationConflict(topology)).toBe(true)
  })
})

describe("discovery scope (§2.1)", () => {
  it("validates namespaces, prefixes and watchAll", () => {
    const problems = (scope: Partial<DiscoveryScope>) =>
      validateDiscoveryScope({ namespaces: [], endpointPrefixes: [], watchAll: false, ...scope }).map(
        (p) => `${p.setting}: ${p.message}`
      )
    expect(problems({})).toEqual([
      "namespaces: at least one discovery namespace is required unless watchAll is true"
    ])
    expect(problems({ watchAll: true })).toEqual([])
    expect(problems({ watchAll: true, namespaces: ["prod"] })).toEqual([
      "watchAll: watchAll cannot be combined with explicit discovery namespaces"
    ])
    expect(problems({ namespaces: [" prod"] })).toEqual([
      'namespaces[0]: " prod" must not have surrounding whitespace'
    ])
    expect(problems({ namespaces: ["prod", ""] })).toEqual(["namespaces[1]: must not be empty"])
    expect(problems({ namespaces: ["prod", "prod"] })).toEqual([
      'namespaces[1]: "prod" is listed more than once'
    ])
    expect(
      problems({ namespaces: ["prod-a"], endpointPrefixes: ["prod-a.backend ", "prod-a.backend"] })
    ).toEqual(['endpointPrefixes[0]: "prod-a.backend " must not have surrounding whitespace'])
    expect(problems({ namespaces: ["prod-a"], endpointPrefixes: ["prod-b.backend"] })).toEqual([
      'endpointPrefixes[0]: "prod-b.backend" is outside the configured namespaces ["prod-a"]'
    ])
    expect(problems({ namespaces: ["prod"], endpointPrefixes: ["prod-a"] })).toHaveLength(1)
    expect(
      problems({ namespaces: ["prod-a", "prod-b"], endpointPrefixes: ["prod-a.backend", "prod-b"] })
    ).toEqual([])
  })

  it("matches prefixes part by part; a fourth part never matches", () => {
    const generate = endpoint("prod-a.backend.generate")
    expect(endpointMatchesPrefix(generate, "prod-a")).toBe(true)
    expect(endpointMatchesPrefix(generate, "prod-a.backend")).toBe(true)
    expect(endpointMatchesPrefix(generate, "prod-a.backend.generate")).toBe(true)
    expect(endpointMatchesPrefix(generate, "prod-a.back")).toBe(false)
    expect(endpointMatchesPrefix(generate, "prod-a.backend.generate.x")).toBe(false)
    const scope = { namespaces: ["prod-a", "prod-b"], endpointPrefixes: ["prod-a.backend"], watchAll: false }
    expect(scopeMatches(scope, generate)).toBe(true)
    expect(scopeMatches(scope, endpoint("prod-a.backend2.generate"))).toBe(false)
    expect(scopeMatches(scope, endpoint("prod-b.backend.generate"))).toBe(false)
    expect(scopeMatches({ ...scope, endpointPrefixes: [] }, endpoint("prod-b.backend.generate"))).toBe(true)
    expect(scopeMatches({ ...scope, endpointPrefixes: [] }, endpoint("staging.backend.generate"))).toBe(false)
  })

  it("the projection only sees endpoints in scope, and names outside it are not ambiguous", () => {
    const cards = [
      card({ endpoint: "prod-a.backend.generate" }),
      card({ endpoint: "prod-b.backend.generate", name: "llama", sourcePath: "other/llama", worker: 2 }),
      card({
        endpoint: "staging.backend.generate",
        worker: 3,
        suffix: "l",
        name: "llama",
        lora: { name: "l" }
      }),
      card({ endpoint: "staging.backend.generate", worker: 3 })
    ]
    const view = project(cards, { namespaces: ["prod-a", "prod-b"], endpointPrefixes: [], watchAll: false })
    expect([...view.endpoints.keys()].sort()).toEqual(["prod-a.backend.generate", "prod-b.backend.generate"])
    expect(membershipOf(view, "prod-a.backend.generate").conflicts).toEqual([])
  })
})

describe("membership generations (§2.6)", () => {
  it("start at 1 and are assigned in endpoint order", () => {
    const view = project([card({ endpoint: "prod.backend.b" }), card({ endpoint: "prod.backend.a" })])
    expect(membershipOf(view, "prod.backend.a").generation).toBe(1)
    expect(membershipOf(view, "prod.backend.b").generation).toBe(2)
  })

  it("an unchanged card set keeps the view, the membership objects and the generations", () => {
    const projector = new MembershipProjector(WATCH_ALL)
    const cards = [card({ worker: 1 }), card({ worker: 2 })]
    const first = projector.apply(cards)
    expect(first.viewChanged).toBe(true)
    expect(first.changed).toEqual([GENERATE])
    const again = projector.apply([...cards])
    expect(again.viewChanged).toBe(false)
    expect(again.view).toBe(first.view)
    // Re-decoded but identical cards: rebuilt, found equal, kept.
    const redecoded = projector.apply([card({ worker: 2 }), card({ worker: 1 })])
    expect(redecoded.viewChanged).toBe(false)
    expect(membershipOf(redecoded.view)).toBe(membershipOf(first.view))
  })

  it("any other field change takes the next counter value", () => {
    const projector = new MembershipProjector(WATCH_ALL)
    projector.apply([card({ endpoint: "prod.backend.a" }), card({ endpoint: "prod.backend.b" })])
    const update = projector.apply([
      card({ endpoint: "prod.backend.a", runtime: { totalKvBlocks: "1000" } }),
      card({ endpoint: "prod.backend.b" })
    ])
    expect(update.changed).toEqual(["prod.backend.a"])
    expect(membershipOf(update.view, "prod.backend.a").generation).toBe(3)
    expect(membershipOf(update.view, "prod.backend.b").generation).toBe(2)
    const aliases = projector.apply([
      card({ endpoint: "prod.backend.a", runtime: { totalKvBlocks: "1000" } }),
      card({ endpoint: "prod.backend.b", aliases: ["bee"] })
    ])
    expect(membershipOf(aliases.view, "prod.backend.b").generation).toBe(4)
  })

  it("a removed endpoint leaves the view and takes a new generation when it reappears", () => {
    const projector = new MembershipProjector(WATCH_ALL)
    const a = card({ endpoint: "prod.backend.a" })
    projector.apply([a])
    const removed = projector.apply([])
    expect(removed.removed).toEqual(["prod.backend.a"])
    expect(removed.view.endpoints.size).toBe(0)
    const back = projector.apply([a])
    expect(membershipOf(back.view, "prod.backend.a").generation).toBe(2)
  })

  it("resolving a conflict advances the generation", () => {
    const projector = new MembershipProjector(WATCH_ALL)
    const first = projector.apply([
      card({ worker: 1 }),
      card({ worker: 2, sourcePath: "nvidia/embed", blockSize: 32 })
    ])
    expect(isMaterializable(membershipOf(first.view))).toBe(false)
    const resolved = projector.apply([card({ worker: 1 })])
    const membership = membershipOf(resolved.view)
    expect(isMaterializable(membership)).toBe(true)
    expect(membership.generation).toBeGreaterThan(membershipOf(first.view).generation)
  })

  it("a name turning ambiguous in another endpoint changes this endpoint's membership and generation", () => {
    const projector = new MembershipProjector(WATCH_ALL)
    const chat = card({ endpoint: "prod.backend.chat", name: "chat", sourcePath: "meta/chat" })
    const llama = card({ endpoint: "prod.backend.llama", worker: 2 })
    const adapter = card({
      endpoint: "prod.backend.llama",
      worker: 2,
      suffix: "c",
      name: "chat",
      lora: { name: "c" }
    })
    const first = projector.apply([chat, llama])
    const ambiguous = projector.apply([chat, llama, adapter])
    expect(ambiguous.changed).toEqual(["prod.backend.chat", "prod.backend.llama"])
    expect(membershipOf(ambiguous.view, "prod.backend.chat").registrations).toEqual([])
    expect(membershipOf(ambiguous.view, "prod.backend.chat").generation).toBeGreaterThan(
      membershipOf(first.view, "prod.backend.chat").generation
    )
    const restored = projector.apply([chat, llama])
    expect(restored.changed).toEqual(["prod.backend.chat", "prod.backend.llama"])
    expect(membershipOf(restored.view, "prod.backend.chat").registrations.map((r) => r.model)).toEqual([
      "chat"
    ])
  })

  it("soft errors are reported once while they persist", () => {
    const projector = new MembershipProjector(WATCH_ALL)
    const bad = card({ worker: 2, suffix: "t", name: "t", lora: { name: "t" } })
    expect(projector.apply([card(), bad]).reported.map((d) => d.key)).toEqual([
      "orphan-adapter:prod/backend/generate/2/t"
    ])
    expect(projector.apply([card({ aliases: ["a"] }), bad]).reported).toEqual([])
    expect(projector.apply([card()]).reported).toEqual([])
    expect(projector.apply([card(), bad]).reported).toHaveLength(1)
  })
})

describe("incremental projection equals full projection", () => {
  const endpoints = ["prod.backend.a", "prod.backend.b", "prod.router.c", "staging.backend.a"]
  const specArb: fc.Arbitrary<CardSpec> = fc
    .record({
      endpoint: fc.constantFrom(...endpoints),
      worker: fc.constantFrom(1, 2, 3),
      name: fc.constantFrom("llama", "chat", "mistral", " bad"),
      sourcePath: fc.constantFrom("meta/llama", "meta/chat"),
      blockSize: fc.constantFrom(64, 64, 64, 0, 32),
      aliases: fc.subarray(["chat", "shared", "llama", " x"]),
      workerType: fc.constantFrom("aggregated", "prefill", "decode", null),
      adapter: fc.constantFrom(
        null,
        null,
        { suffix: "t", lora: { name: "tenant", maxGpuLoraCount: 4 } },
        { suffix: "u", lora: { name: "tenant", maxGpuLoraCount: 8 } },
        { suffix: "v", lora: { name: "other" } },
        { suffix: "w", lora: null },
        { suffix: null, lora: { name: "tenant" } }
      ),
      dp: fc.constantFrom(1, 2)
    })
    .map(({ adapter, dp, ...spec }) => ({
      ...spec,
      ...(adapter === null
        ? {}
        : {
            suffix: adapter.suffix,
            lora: adapter.lora,
            name: adapter.suffix === "t" ? "tenant" : spec.name
          }),
      runtime: { dataParallelSize: dp }
    }))

  it("for random card-set sequences (same views, same generations, same changed endpoints)", () => {
    fc.assert(
      fc.property(
        fc.array(specArb, { minLength: 4, maxLength: 24 }),
        fc.array(fc.array(fc.nat(), { maxLength: 14 }), { minLength: 1, maxLength: 6 }),
        (specs, steps) => {
          const pool = specs.map((spec) => card(spec))
          const scope: DiscoveryScope = { namespaces: ["prod"], endpointPrefixes: [], watchAll: false }
          const projector = new MembershipProjector(scope)
          let full = { view: { endpoints: new Map() } as DcMembershipView, nextGeneration: 1 }
          for (const picks of steps) {
            const seen = new Set<string>()
            const cards: Array<ModelCardInstance> = []
            for (const pick of picks) {
              const chosen = pool[pick % pool.length]!
              const id = `${chosen.namespace}.${chosen.component}.${chosen.endpoint}/${chosen.instanceId}/${chosen.modelSuffix}`
              if (seen.has(id)) continue
              seen.add(id)
              cards.push(chosen)
            }
            const incremental = projector.apply(cards)
            const next = projectMembership(cards, {
              scope,
              previous: full.view,
              nextGeneration: full.nextGeneration
            })
            expect([...incremental.view.endpoints.keys()].sort()).toEqual(
              [...next.view.endpoints.keys()].sort()
            )
            for (const [key, membership] of next.view.endpoints) {
              const other = incremental.view.endpoints.get(key)!
              expect(membershipEquals(membership, other)).toBe(true)
              expect(other.generation).toBe(membership.generation)
            }
            const changedFull = [...next.view.endpoints.values()]
              .filter((m) => full.view.endpoints.get(m.key) !== m)
              .map((m) => m.key)
              .sort()
            expect([...incremental.changed]).toEqual(changedFull)
            full = next
          }
        }
      ),
      { numRuns: 200 }
    )
  })
})
