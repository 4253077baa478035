#!/usr/bin/env bash
# Paired A/B of two `sluice` binaries on one account's requests: both serve the same config
# side by side, and short wrk runs alternate between them (the order switching every round),
# so the VM's drift hits both alike.
# Prints each round's req/s and the median of the per-round ratios B/A.
#
# Usage: bench/http-ab.sh A_BINARY B_BINARY [ROUNDS] [ACCOUNT]
#   (default 8 rounds of 3 s; ACCOUNT alice@example.com, at 1/s: nearly every answer a 429;
#   admin@example.com is the bypass). Build an older commit's binary with
#   `git worktree add /tmp/old COMMIT && cargo build --release -p sluice-cli --manifest-path /tmp/old/Cargo.toml`.
set -euo pipefail
source "$(dirname "$0")/common.sh"
A=$1; B=$2; ROUNDS=${3:-8}; ACCOUNT=${4:-alice@example.com}
DURATION=${DURATION:-3s}; CONNECTIONS=${CONNECTIONS:-100}
command -v wrk >/dev/null || install_packages wrk

scratch
write_bench_config "$tmp/sluice.yaml"
start() { # binary, name: sets url
  "$1" serve --config "$tmp/sluice.yaml" --listen 127.0.0.1:0 >"$tmp/$2.out" 2>"$tmp/$2.err" &
  pids+=($!)
  url=$(listening_url "$tmp/$2.out" "$tmp/$2.err")
}
start "$A" a; url_a=$url
start "$B" b; url_b=$url
rps() { wrk -t1 -c"$CONNECTIONS" -d"$DURATION" -H "X-Account-ID: $ACCOUNT" "$1" | awk '/^Requests\/sec:/ {print $2}'; }
rps "$url_a" >/dev/null; rps "$url_b" >/dev/null
echo "round  A req/s  B req/s  B/A"
for round in $(seq "$ROUNDS"); do
  # Odd rounds run A first, even rounds B, so neither always follows the other.
  if ((round % 2)); then a=$(rps "$url_a"); b=$(rps "$url_b"); else b=$(rps "$url_b"); a=$(rps "$url_a"); fi
  echo "$round $a $b" | awk '{printf "%5d %8.0f %8.0f %5.3f\n", $1, $2, $3, $3 / $2}' | tee -a "$tmp/rounds"
done
awk '{print $4}' "$tmp/rounds" | sort -g |
  awk '{r[NR] = $1} END {printf "median B/A over %d rounds: %.3f\n", NR, (NR % 2) ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2}'
