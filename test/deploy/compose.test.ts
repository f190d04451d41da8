import { existsSync, readdirSync, readFileSync, statSync } from "node:fs"
import { join } from "node:path"
import { Either } from "effect"
import { describe, expect, it } from "vitest"
import { parse } from "yaml"
import type { CommandSpec } from "../../src/cli/args.js"
import {
  GlobalSettings,
  globalCommand,
  loadSettings,
  RelaySettings,
  relayCommand,
  relayDiscoveryConfig,
  SimulateSettings,
  simulateCommand,
  splitAddress,
  splitRelayTarget
} from "../../src/cli/settings.js"

// No container engine runs here, so the deployment is validated structurally: every reference
// resolves, every port a client uses is one its server listens on, every kvrelay command is a
// valid invocation of the CLI, and the dashboard plots metrics the code exports.

const root = join(import.meta.dirname, "..", "..")
// `merge`: compose resolves YAML merge keys (`<<: *timing`), so the test does too.
const readYaml = (path: string): Record<string, unknown> =>
  parse(readFileSync(join(root, path), "utf8"), { merge: true }) as Record<string, unknown>

interface Service {
  readonly image?: string
  readonly build?: string
  readonly command?: ReadonlyArray<string>
  readonly environment?: Record<string, string>
  readonly ports?: ReadonlyArray<string>
  readonly volumes?: ReadonlyArray<string>
  readonly depends_on?: ReadonlyArray<string> | Record<string, unknown>
  readonly restart?: string
  readonly healthcheck?: { readonly test: ReadonlyArray<string> }
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
const dependencies = (service: Service): ReadonlyArray<string> =>
  Array.isArray(service.depends_on) ? service.depends_on : Object.keys(service.depends_on ?? {})
const hostPort = (target: string): [string, number] => {
  const url = target.includes("://") ? new URL(target) : new URL(`http://${target}`)
  return [url.hostname, Number(url.port)]
}
/** The value of `--name=value` in a command (compose commands use the `=` form). */
const flagValue = (service: Service, name: string): string | undefined =>
  service.command?.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3)
/** Ports a service listens on inside the network. */
const listening = (name: string): ReadonlyArray<number> => {
  const service = services[name]!
  const ports = new Set<number>()
  for (const mapping of service.ports ?? []) ports.add(Number(mapping.split(":").at(-1)))
  const http = flagValue(service, "http")
  if (http !== undefined) ports.add(splitAddress(http).port)
  if (name === "otel-collector") ports.add(8888)
  if (name === "jaeger") ports.add(4317)
  return [...ports]
}
/** Where a service mounts a repository path (`./otel/x:/etc/x:ro` → `/etc/x`). */
const mountOf = (service: Service, source: string): string | undefined =>
  service.volumes?.map((v) => v.split(":")).find(([from]) => from === source)?.[1]

const specs: Record<string, CommandSpec> = {
  relay: relayCommand,
  global: globalCommand,
  simulate: simulateCommand
}
const noFile = { env: {}, readFile: () => "{}" }

describe("docker-compose.yml", () => {
  it("brings up etcd, two relays with simulated workers, a global consumer and the observability stack", () => {
    expect(Object.keys(services).sort()).toEqual(
      [
        "etcd",
        "global",
        "grafana",
        "jaeger",
        "otel-collector",
        "prometheus",
        "relay-a",
        "relay-b",
        "simulator-a",
        "simulator-b"
      ].sort()
    )
    expect(existsSync(join(root, "Dockerfile"))).toBe(true)
  })

  it("restarts every service unless stopped", () => {
    for (const [name, service] of Object.entries(services))
      expect(service.restart, `${name} restart policy`).toBe("unless-stopped")
  })

  it("resolves every dependency, bind mount and named volume", () => {
    for (const [name, service] of Object.entries(services)) {
      for (const dependency of dependencies(service))
        expect(services, `${name} depends on ${dependency}`).toHaveProperty(dependency)
      for (const volume of service.volumes ?? []) {
        const source = volume.split(":")[0]!
        if (source.startsWith("."))
          expect(existsSync(join(root, source)), `${name} mounts ${source}`).toBe(true)
        else expect(compose.volumes, `${name} uses volume ${source}`).toHaveProperty(source)
      }
    }
  })

  it("runs only known kvrelay commands with known flags and valid values", () => {
    expect(kvrelayServices.map(([name]) => name).sort()).toEqual([
      "global",
      "relay-a",
      "relay-b",
      "simulator-a",
      "simulator-b"
    ])
    for (const [name, service] of kvrelayServices) {
      const [command, ...argv] = service.command!
      const spec = specs[command!]
      expect(spec, `${name} runs kvrelay ${command}`).toBeDefined()
      const schema =
        command === "relay" ? RelaySettings : command === "global" ? GlobalSettings : SimulateSettings
      const settings = loadSettings(spec!, schema as typeof RelaySettings, { argv, ...noFile })
      expect(Either.isRight(settings), `${name}: ${JSON.stringify(settings)}`).toBe(true)
    }
  })

  it("wires the relays to etcd and the collector, and the global consumer to the relays", () => {
    for (const [name, service] of kvrelayServices) {
      const [command, ...argv] = service.command!
      const otlp = service.environment?.["OTEL_EXPORTER_OTLP_ENDPOINT"]
      expect(otlp, `${name} exports traces`).toBeDefined()
      const [host, port] = hostPort(otlp!)
      expect(services).toHaveProperty(host)
      expect(collector.receivers.otlp.protocols.http.endpoint.endsWith(`:${port}`)).toBe(true)
      if (command === "relay") {
        const settings = Either.getOrThrow(loadSettings(relayCommand, RelaySettings, { argv, ...noFile }))
        const discovery = Either.getOrThrow(relayDiscoveryConfig(settings))
        expect(discovery.backend._tag).toBe("Etcd")
        if (discovery.backend._tag === "Etcd") {
          for (const endpoint of discovery.backend.endpoints) {
            const [etcdHost, etcdPort] = hostPort(endpoint)
            expect(etcdHost).toBe("etcd")
            expect(etcdPort).toBe(2379)
          }
        }
      } else if (command === "global") {
        const settings = Either.getOrThrow(loadSettings(globalCommand, GlobalSettings, { argv, ...noFile }))
        for (const target of settings.relay) {
          const [relayHost, relayPort] = hostPort(splitRelayTarget(target).url)
          expect(services[relayHost]?.command?.[0], `${target} names a relay service`).toBe("relay")
          expect(listening(relayHost)).toContain(relayPort)
        }
      }
    }
  })

  it("feeds every relay from a simulator that registers under the relay's etcd prefix and advertises its own name", () => {
    const relays = kvrelayServices.filter(([, s]) => s.command![0] === "relay")
    const simulators = kvrelayServices.filter(([, s]) => s.command![0] === "simulate")
    const prefixes = new Set<string>()
    for (const [name, service] of simulators) {
      const settings = Either.getOrThrow(
        loadSettings(simulateCommand, SimulateSettings, { argv: service.command!.slice(1), ...noFile })
      )
      expect(settings.etcd, `${name} --etcd`).toBeDefined()
      for (const url of settings.etcd ?? []) expect(hostPort(url), `${name} --etcd`).toEqual(["etcd", 2379])
      // The relay connects to the address in the source records: the simulator's service name,
      // on sockets bound to every interface.
      expect(settings.advertiseHost, `${name} --advertise-host`).toBe(name)
      expect(settings.bindHost, `${name} --bind-host`).toBe("0.0.0.0")
      expect(prefixes.has(settings.etcdPrefix), `${name}: one simulator per prefix`).toBe(false)
      prefixes.add(settings.etcdPrefix)
    }
    for (const [name, service] of relays)
      expect(prefixes, `${name} has workers`).toContain(flagValue(service, "etcd-prefix"))
    const ids = simulators.map(([, s]) => Number(flagValue(s, "worker-id-base")))
    expect(new Set(ids).size, "worker ids do not collide").toBe(ids.length)
  })

  it("health-checks every kvrelay server on the port it listens on", () => {
    for (const [name, service] of kvrelayServices) {
      const http = flagValue(service, "http")
      if (http === undefined) {
        expect(service.command![0], `${name} serves no HTTP`).toBe("simulate")
        continue
      }
      const test = service.healthcheck?.test
      expect(test, `${name} healthcheck`).toBeDefined()
      // The image has node and no curl: the check is a fetch of /healthz.
      expect(test!.slice(0, 3)).toEqual(["CMD", "node", "-e"])
      const url = /fetch\('([^']+)'\)/.exec(test![3]!)?.[1]
      expect(url, `${name} checks a URL`).toBeDefined()
      const [host, port] = hostPort(url!)
      expect(host).toBe("127.0.0.1")
      expect(port, `${name} checks its --http port`).toBe(splitAddress(http).port)
      expect(new URL(url!).pathname).toBe("/healthz")
    }
    expect(services["etcd"]!.healthcheck?.test).toContain("endpoint")
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
    for (const [name, service] of kvrelayServices)
      if (flagValue(service, "http") !== undefined) expect(scraped.has(name), `${name} is scraped`).toBe(true)
  })
})

/** Every `.ts` file under `dir`, concatenated. */
const sourceText = (dir: string): string =>
  readdirSync(dir)
    .map((entry) => {
      const path = join(dir, entry)
      if (statSync(path).isDirectory()) return sourceText(path)
      return entry.endsWith(".ts") ? readFileSync(path, "utf8") : ""
    })
    .join("\n")

describe("otel/grafana", () => {
  const grafana = services["grafana"]!
  const datasource = readYaml("otel/grafana/provisioning/datasources/prometheus.yaml") as {
    datasources: Array<{ uid: string; type: string; url: string }>
  }
  const provider = readYaml("otel/grafana/provisioning/dashboards/kvrelay.yaml") as {
    providers: Array<{ options: { path: string } }>
  }
  const dashboard = JSON.parse(readFileSync(join(root, "otel/grafana/dashboards/kvrelay.json"), "utf8")) as {
    uid: string
    panels: Array<{
      type: string
      title: string
      datasource?: { uid: string }
      targets?: Array<{ expr: string; datasource?: { uid: string } }>
    }>
  }

  it("provisions the compose Prometheus and the dashboard directory it mounts", () => {
    expect(mountOf(grafana, "./otel/grafana/provisioning")).toBe("/etc/grafana/provisioning")
    const prom = datasource.datasources.find((d) => d.type === "prometheus")!
    const [host, port] = hostPort(prom.url)
    expect(services).toHaveProperty(host)
    expect(listening(host)).toContain(port)
    expect(provider.providers.map((p) => p.options.path)).toContain(
      mountOf(grafana, "./otel/grafana/dashboards")
    )
    expect(grafana.environment?.["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]).toBe(
      `${mountOf(grafana, "./otel/grafana/dashboards")}/kvrelay.json`
    )
    for (const panel of dashboard.panels.filter((p) => p.type !== "row")) {
      expect(panel.datasource?.uid, panel.title).toBe(prom.uid)
      for (const target of panel.targets ?? []) expect(target.datasource?.uid, panel.title).toBe(prom.uid)
    }
  })

  it("plots only metrics the relay and the global consumer export", () => {
    const src = sourceText(join(root, "src"))
    const exprs = dashboard.panels.flatMap((p) => p.targets ?? []).map((t) => t.expr)
    expect(exprs.length).toBeGreaterThan(15)
    const names = new Set(
      exprs.flatMap((e) =>
        [...e.matchAll(/\b((?:kv_dc_relay|kvrelay|nodejs|process)_[a-z0-9_]+)/g)].map((m) => m[1]!)
      )
    )
    for (const name of names) {
      if (name.startsWith("nodejs_") || name.startsWith("process_")) {
        // prom-client's default metrics, registered by the exposition.
        expect(src.includes("collectDefaultMetrics("), name).toBe(true)
        continue
      }
      // A histogram's series carry suffixes its family name does not.
      const family = name.replace(/_(bucket|sum|count)$/, "")
      expect(src.includes(`"${name}"`) || src.includes(`"${family}"`), `${name} is exported`).toBe(true)
    }
  })
})
