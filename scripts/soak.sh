#!/usr/bin/env bash
# The soak: `sluice serve` (HTTP demo, RLS, check API, admin; rules polled from a real rules
# service; counters on a real redis-server) under mixed load for MINUTES: hot keys, a flood of
# new keys, a rules change every 3 s, Redis restarted every 5 minutes and the rules service
# every 7. Prints one CSV line a minute (RSS, open files, threads, p99 latency, requests,
# errors) and fails on any request error or on growth (crates/sluice-cli/tests/soak.rs).
# Not part of ./test.sh: it takes the machine for MINUTES.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=${1:-}
if ! [[ "$minutes" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/soak.sh MINUTES (how long the load runs)" >&2
  exit 2
fi
scripts/ensure-redis.sh
SLUICE_SOAK_MINUTES=$minutes cargo test --release -p sluice-cli --test soak -- --ignored --nocapture
