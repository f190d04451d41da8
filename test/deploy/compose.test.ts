import { existsSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { Either } from "effect"
import { describe, expect, it } from "vitest"
import { parse } from "yaml"
import {
  GlobalSettings,
  globalCommand,
  loadSettings,
  RelaySettings,
  relayCommand,
  relayDiscoveryConfig,
  splitRelayTarget
} from "../../src/cli/settings.js"

// No container engine runs here, so the deployment is validated structurally: every reference
// resolves, every port a client uses is one its server listens on, and every kvrelay command is a
// valid invocation of the CLI.

const root = join(import.meta.dirname, "..", "..")
const readYaml = (path: string): Record<string, unknown> =>
  parse(readFileSync(join(root, path), "utf8")) as Record<string, unknown>

interface Service {
  readonly image?: string
  readonly build?: string
  readonly command?: ReadonlyArray<string>
  readonly environment?: Record<string, string>
  readonly ports?: ReadonlyArray<string>
  readonly volumes?: ReadonlyArray<string>
  readonly depends_on?: ReadonlyArray<string>
}

const compose = readYaml("docker-compose.yml") as {
  services: Record<string, Service>
  volumes?: Record<string, unknown>
}
const services = compose.services
const collector = readYaml("otel/collector.yaml") as {
  receivers: { otlp: { protocols: { http: { endpoint: string } } } }
  processors: Record<string, unknown>
  exporters: Record<string, { endpoint?: string }>
  service: {
    pipelines: Record<
      string,
      { receivers: Array<string>; processors: Array<string>; exporters: Array<string> }
    >
  }
}
const prometheus = readYaml("otel/prometheus.yml") as {
  scrape_configs: Array<{
    job_name: string
    metrics_path?: string
    static_configs: Array<{ targets: Array<string> }>
  }>
}

const kvrelayServices = Object.entries(services).filter(([, s]) => s.build !== undefined)
const hostPort = (target: string): [string, number] => {
  const url = target.includes("://") ? new URL(target) : new URL(`http://${target}`)
  return [url.hostname, Number(url.port)]
}
/** Ports a service listens on inside the network. */
const listening = (name: string): ReadonlyArray<number> => {
  const service = services[name]!
  const ports = new Set<number>()
  for (const mapping of service.ports ?? []) ports.add(Number(mapping.split(":").at(-1)))
  const http = service.command?.find((a) => a.startsWith("--http="))
  if (http !== undefined) ports.add(Number(http.split(":").at(-1)))
  if (name === "otel-collector") ports.add(8888)
  if (name === "jaeger") ports.add(4317)
  return [...ports]
}

describe("docker-compose.yml", () => {
  it("brings up the relays, etcd, a global consumer, the collector, Jaeger and Prometheus", () => {
    expect(Object.keys(services).sort()).toEqual(
      ["etcd", "global", "jaeger", "otel-collector", "prometheus", "relay-a", "relay-b"].sort()
    )
    expect(existsSync(join(root, "Dockerfile"))).toBe(true)
  })

  it("resolves every dependency, bind mount and named volume", () => {
    for (const [name, service] of Object.entries(services)) {
      for (const dependency of service.depends_on ?? [])
        expect(services, `${name} depends on ${dependency}`).toHaveProperty(dependency)
      for (const volume of service.volumes ?? []) {
        const source = volume.split(":")[0]!
        if (source.startsWith("."))
          expect(existsSync(join(root, source)), `${name} mounts ${source}`).toBe(true)
        else expect(compose.volumes, `${name} uses volume ${source}`).toHaveProperty(source)
      }
    }
  })

  it("runs valid kvrelay commands wired to etcd, each other and the collector", () => {
    expect(kvrelayServices.map(([name]) => name).sort()).toEqual(["global", "relay-a", "relay-b"])
    for (const [name, service] of kvrelayServices) {
      const [command, ...argv] = service.command!
      const otlp = service.environment?.["OTEL_EXPORTER_OTLP_ENDPOINT"]
      expect(otlp, `${name} exports traces`).toBeDefined()
      const [host, port] = hostPort(otlp!)
      expect(services).toHaveProperty(host)
      expect(collector.receivers.otlp.protocols.http.endpoint.endsWith(`:${port}`)).toBe(true)
      if (command === "relay") {
        const settings = loadSettings(relayCommand, RelaySettings, { argv, env: {}, readFile: () => "{}" })
        expect(Either.isRight(settings), `${name}: ${JSON.stringify(settings)}`).toBe(true)
        const discovery = Either.getOrThrow(relayDiscoveryConfig(Either.getOrThrow(settings)))
        expect(discovery.backend._tag).toBe("Etcd")
        if (discovery.backend._tag === "Etcd") {
          for (const endpoint of discovery.backend.endpoints) {
            const [etcdHost, etcdPort] = hostPort(endpoint)
            expect(etcdHost).toBe("etcd")
            expect(etcdPort).toBe(2379)
          }
        }
      } else {
        expect(command).toBe("global")
        const settings = Either.getOrThrow(
          loadSettings(globalCommand, GlobalSettings, { argv, env: {}, readFile: () => "{}" })
        )
        for (const target of settings.relay) {
          const [relayHost, relayPort] = hostPort(splitRelayTarget(target).url)
          expect(services[relayHost]?.command?.[0], `${target} names a relay service`).toBe("relay")
          expect(listening(relayHost)).toContain(relayPort)
        }
      }
    }
  })
})

describe("otel/collector.yaml", () => {
  it("sends every traces pipeline component to something defined, ending in Jaeger", () => {
    const traces = collector.service.pipelines["traces"]!
    for (const receiver of traces.receivers) expect(collector.receivers).toHaveProperty(receiver)
    for (const processor of traces.processors) expect(collector.processors).toHaveProperty(processor)
    for (const exporter of traces.exporters) expect(collector.exporters).toHaveProperty(exporter)
    const jaeger = traces.exporters
      .map((e) => collector.exporters[e]!.endpoint)
      .find((e) => e?.startsWith("jaeger:"))
    expect(jaeger).toBeDefined()
    expect(services["jaeger"]!.environment?.["COLLECTOR_OTLP_ENABLED"]).toBe("true")
    expect(listening("jaeger")).toContain(hostPort(jaeger!)[1])
  })
})

describe("otel/prometheus.yml", () => {
  it("scrapes the relays, the global consumer and the collector on ports they listen on", () => {
    const targets = prometheus.scrape_configs.flatMap((job) => job.static_configs.flatMap((c) => c.targets))
    for (const target of targets) {
      const [host, port] = hostPort(target)
      expect(services, target).toHaveProperty(host)
      expect(listening(host), target).toContain(port)
    }
    const scraped = new Set(targets.map((t) => hostPort(t)[0]))
    for (const [name] of kvrelayServices) expect(scraped.has(name), `${name} is scraped`).toBe(true)
  })
})
