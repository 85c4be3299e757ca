#!/usr/bin/env bash
# Resident memory of a release edgecore with N devices (default 1000) of 10 properties each,
# after a first start and after a restart on the same database, 12 s after each start (the
# steady state: start-up peaks freed and handed back). Usage: docs/rss.sh [N]
set -euo pipefail
n="${1:-1000}"
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/manifests"
{
  printf 'apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {name: m, namespace: default}\nspec:\n  protocol: modbus\n  properties:\n'
  for p in $(seq 0 9); do printf '    - {name: p%d, type: INT, accessMode: ReadWrite}\n' "$p"; done
  for d in $(seq 0 $((n - 1))); do
    printf -- '---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: dev-%d, namespace: default}\nspec:\n  deviceModelRef: {name: m}\n  protocol: {protocolName: modbus, configData: {ip: 127.0.0.1, port: 502}}\n  properties:\n' "$d"
    for p in $(seq 0 9); do
      printf '    - {name: p%d, visitors: {protocolName: modbus, configData: {register: HoldingRegister, offset: %d, limit: 1}}}\n' "$p" "$p"
    done
  done
} > "$work/manifests/devices.yaml"
printf "nodeName: n1\ndataDir: data\nmanifests: {dir: manifests}\nmqtt: {address: '127.0.0.1:18999'}\nhttp: {address: '127.0.0.1:18998'}\n" > "$work/edgecore.yaml"
cargo build --release -q -p edge --bin edgecore --manifest-path "$root/Cargo.toml"
bin="${CARGO_TARGET_DIR:-$root/target}/release/edgecore"
for run in first-start restart; do
  "$bin" --config "$work/edgecore.yaml" 2>"$work/$run.log" &
  pid=$!
  until curl -sf 127.0.0.1:18998/healthz >/dev/null; do sleep 0.05; done
  # Past the first release of freed memory (edge::memory::RELEASE_INTERVAL, 10 s).
  sleep 12
  echo "$run: $(grep -E 'VmRSS|RssAnon' /proc/$pid/status | tr -s ' \t' ' ' | paste -sd ',')"
  kill "$pid"; wait "$pid" || true
done
