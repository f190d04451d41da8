#!/usr/bin/env node
// Registers a worker's discovery records in etcd under one lease, keeps the lease alive, and
// revokes it on SIGINT/SIGTERM, so the records disappear with the worker (PROTOCOL §2: the
// relay reads no leases; an expired or revoked lease reaches it as deletions).
//
//   node examples/etcd-register.mjs --etcd http://127.0.0.1:2379 [--prefix /kvrelay/v1] \
//     [--ttl 10] FILE...
//
// Each FILE is a discovery document ({"version": 1, "cards": [...], "sources": [...]}, the file
// backend's format) or one card or source record. Keys:
//   PREFIX/cards/{namespace}/{component}/{endpoint}/{instanceId}[/{modelSuffix}]
//   PREFIX/sources/{kvStateEndpoint}/{workerId}/{dpRank}/{publisherId}
// Once every key is written it prints one JSON line on stdout:
//   {"event":"registered","lease":"…","keys":[…]}
// It needs the `etcd3` npm package (a dependency of kvrelay; elsewhere `npm install etcd3`).

import { readFileSync } from "node:fs"
import { Etcd3 } from "etcd3"

const usage = "usage: etcd-register.mjs --etcd URL[,URL…] [--prefix PREFIX] [--ttl SECONDS] FILE..."

const fail = (message) => {
  process.stderr.write(`etcd-register: ${message}\n`)
  process.exit(2)
}

const options = { etcd: undefined, prefix: "/kvrelay/v1", ttl: 10 }
const files = []
const argv = process.argv.slice(2)
for (let i = 0; i < argv.length; i++) {
  const arg = argv[i]
  const [flag, inline] = arg.split(/=(.*)/s)
  const value = () => inline ?? argv[++i] ?? fail(`${flag}: missing value`)
  if (flag === "--etcd") options.etcd = value()
  else if (flag === "--prefix") options.prefix = value()
  else if (flag === "--ttl") options.ttl = Number(value())
  else if (flag === "--help" || flag === "-h") {
    process.stdout.write(`${usage}\n`)
    process.exit(0)
  } else if (arg.startsWith("--")) fail(`${flag}: unknown flag\n${usage}`)
  else files.push(arg)
}
if (options.etcd === undefined) fail(`--etcd is required\n${usage}`)
if (!Number.isInteger(options.ttl) || options.ttl < 1) fail("--ttl: expected a positive integer")
if (options.prefix.endsWith("/") || !options.prefix.startsWith("/"))
  fail('--prefix: must start and not end with "/"')
if (files.length === 0) fail(`no FILE given\n${usage}`)

// The relay decodes and validates every record; this only needs the fields its key is built from.
const keyOf = (record, file) => {
  const text = (v) => (typeof v === "number" ? String(v) : v)
  if (record.card !== undefined) {
    const { namespace, component, endpoint, instanceId, modelSuffix } = record
    const parts = [namespace, component, endpoint, text(instanceId)]
    if (parts.some((p) => typeof p !== "string" || p === ""))
      fail(`${file}: a card needs namespace, component, endpoint and instanceId`)
    return `${options.prefix}/cards/${parts.join("/")}${modelSuffix == null ? "" : `/${modelSuffix}`}`
  }
  if (record.transport !== undefined) {
    const parts = [
      record.kvStateEndpoint,
      text(record.workerId),
      text(record.dpRank),
      text(record.publisherId)
    ]
    if (parts.some((p) => typeof p !== "string" || p === ""))
      fail(`${file}: a source needs kvStateEndpoint, workerId, dpRank and publisherId`)
    return `${options.prefix}/sources/${parts.join("/")}`
  }
  return fail(`${file}: neither a card (with "card") nor a source (with "transport") record`)
}

const records = []
for (const file of files) {
  let json
  try {
    json = JSON.parse(readFileSync(file, "utf8"))
  } catch (error) {
    fail(`${file}: ${error.message}`)
  }
  const list = json.version !== undefined ? [...(json.cards ?? []), ...(json.sources ?? [])] : [json]
  for (const record of list) records.push({ key: keyOf(record, file), value: JSON.stringify(record) })
}

const client = new Etcd3({ hosts: options.etcd.split(",") })
const lease = client.lease(options.ttl)
lease.on("lost", (error) => process.stderr.write(`etcd-register: lease lost: ${error.message}\n`))

let stopping = false
const stop = async () => {
  if (stopping) return
  stopping = true
  // Revoking deletes every key of the lease at once; without it they expire after the TTL.
  await lease.revoke().catch(() => undefined)
  client.close()
  process.exit(0)
}
process.on("SIGINT", stop)
process.on("SIGTERM", stop)

try {
  const id = await lease.grant()
  for (const { key, value } of records) await lease.put(key).value(value).exec()
  process.stdout.write(
    `${JSON.stringify({ event: "registered", lease: id, keys: records.map((r) => r.key) })}\n`
  )
} catch (error) {
  process.stderr.write(`etcd-register: ${error.message}\n`)
  client.close()
  process.exit(1)
}
