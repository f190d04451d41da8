#!/usr/bin/env bash
# Registers one worker's card and source records in etcd under a lease and keeps the lease alive
# until it is stopped (SIGINT/SIGTERM), then revokes it so the records disappear at once. A worker
# that dies without revoking loses its records when the lease's TTL runs out (PROTOCOL §2).
#
#   ETCDCTL_ENDPOINTS=http://127.0.0.1:2379 examples/etcd-register.sh CARD.json SOURCE.json...
#
# Environment: ETCDCTL_ENDPOINTS (etcdctl's own variable), KVRELAY_ETCD_PREFIX (default
# /kvrelay/v1, as `kvrelay relay --etcd-prefix`), LEASE_TTL (seconds, default 10).
# Each file holds one card record (it has "card") or one source record (it has "transport").
# Needs etcdctl (v3 API) and jq.
set -euo pipefail

prefix="${KVRELAY_ETCD_PREFIX:-/kvrelay/v1}"
ttl="${LEASE_TTL:-10}"
export ETCDCTL_API=3

if [ "$#" -eq 0 ]; then
  echo "usage: ETCDCTL_ENDPOINTS=URL $0 RECORD.json..." >&2
  exit 2
fi

key_of() {
  # Card:   PREFIX/cards/{namespace}/{component}/{endpoint}/{instanceId}[/{modelSuffix}]
  # Source: PREFIX/sources/{kvStateEndpoint}/{workerId}/{dpRank}/{publisherId}
  jq -er --arg prefix "$prefix" '
    if has("card") then
      "\($prefix)/cards/\(.namespace)/\(.component)/\(.endpoint)/\(.instanceId)"
        + (if .modelSuffix == null then "" else "/\(.modelSuffix)" end)
    elif has("transport") then
      "\($prefix)/sources/\(.kvStateEndpoint)/\(.workerId)/\(.dpRank)/\(.publisherId)"
    else error("neither a card nor a source record") end' "$1"
}

# `lease grant` prints "lease 694d77aa9a3b5c0e granted with TTL(10s)".
lease="$(etcdctl lease grant "$ttl" | awk '/^lease/ { print $2 }')"
if [ -z "$lease" ]; then
  echo "etcd-register: could not grant a lease" >&2
  exit 1
fi

revoke() {
  etcdctl lease revoke "$lease" >/dev/null 2>&1 || true
}
trap 'revoke; exit 0' INT TERM

keys=()
for file in "$@"; do
  key="$(key_of "$file")"
  jq -c . "$file" | etcdctl put --lease="$lease" "$key" >/dev/null
  keys+=("$key")
done
echo "registered ${#keys[@]} keys under lease $lease: ${keys[*]}"

# keep-alive runs until it is killed; waiting on it in the background lets the trap run at once.
etcdctl lease keep-alive "$lease" >/dev/null &
keepalive=$!
trap 'kill "$keepalive" 2>/dev/null; revoke; exit 0' INT TERM
wait "$keepalive"
