#!/usr/bin/env bash
# Makes sure redis-server, redis-cli and redis-benchmark are installed (the Redis tests and
# benchmark start their own server). Idempotent and quiet: does nothing when they are present.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 \
  && command -v redis-benchmark >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends redis-server redis-tools; } >"$log" 2>&1; then
  cat "$log" >&2
  rm -f "$log"
  echo "ensure-redis: apt-get could not install redis-server and redis-tools" >&2
  exit 1
fi
rm -f "$log"
command -v redis-server >/dev/null 2>&1 || { echo "ensure-redis: redis-server still missing after apt-get install" >&2; exit 1; }
