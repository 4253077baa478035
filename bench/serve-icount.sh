#!/usr/bin/env bash
# User-space instructions per request of `sluice serve` on one thread, per account, counted by
# valgrind's callgrind: unlike req/s on a shared VM, the count does not move between runs, so
# it shows what a change to the request path costs. The kernel's share (the TCP path, about
# 60% of the server's CPU time under wrk) is not counted.
#
# Usage: bench/serve-icount.sh [SLUICE_BINARY] [ACCOUNT...]
#   (default target/release/sluice; accounts admin@example.com (bypass, the control) and
#   alice@example.com (at 1/s: nearly every answer a 429)). Installs valgrind and wrk from
#   Debian if missing. Prints, per account, requests served and instructions per request, and
#   the top functions by instructions (`callgrind_annotate` on the kept output files).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/sluice}
shift || true
ACCOUNTS=("$@")
[ ${#ACCOUNTS[@]} -gt 0 ] || ACCOUNTS=(admin@example.com alice@example.com)

need=()
command -v valgrind >/dev/null || need+=(valgrind)
command -v wrk >/dev/null || need+=(wrk)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -x "$BIN" ] || cargo build --release -q -p sluice-cli

out=${OUT:-target/serve-icount}
mkdir -p "$out"
cat > "$out/sluice.yaml" <<'YAML'
fetch_latency: 0s
bypass: [admin@example.com]
accounts:
  alice@example.com: 1/s
YAML
for account in "${ACCOUNTS[@]}"; do
  file="$out/$account.callgrind"
  valgrind --tool=callgrind --callgrind-out-file="$file" \
    "$BIN" serve --config "$out/sluice.yaml" --threads 1 --listen 127.0.0.1:0 \
    >"$out/$account.out" 2>"$out/$account.err" &
  pid=$!
  for _ in $(seq 300); do grep -q '^listening on ' "$out/$account.out" 2>/dev/null && break; sleep 0.1; done
  url=$(sed -n 's/^listening on //p' "$out/$account.out")
  [ -n "$url" ] || { echo "sluice did not start under valgrind:"; cat "$out/$account.err"; exit 1; }
  requests=$(wrk -t1 -c10 -d8s -H "X-Account-ID: $account" "$url/" | awk '/requests in/ {print $1}')
  kill -INT "$pid"
  wait "$pid" || true
  total=$(awk '/^(summary|totals):/ {print $2; exit}' "$file")
  # Start-up (about 1% of the total at these request counts) is included.
  echo "$account: $requests requests, $((total / requests)) instructions per request ($file)"
done
