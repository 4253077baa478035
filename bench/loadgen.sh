#!/usr/bin/env bash
# How hard `sluice loadtest`'s load generator can push, with wrk in the same run as the peer:
# each loads one nginx worker answering "Hello World!" on 127.0.0.1 for DURATION with the same
# number of keep-alive connections, one after the other. Prints requests per second and the
# generator/wrk ratio.
#
#   bench/loadgen.sh            # 10 s per run, 4 and 48 connections
#   DURATION=5 CONNECTIONS="8" bench/loadgen.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-"4 48"}
PORT=${PORT:-18089}

missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
install_packages "${missing[@]}"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

cargo build --release -q -p sluice-loadtest --example loadtest
LOADTEST=target/release/examples/loadtest

work=$(mktemp -d)
cleanup() {
  [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/logs"
cat > "$work/nginx.conf" <<CONF
worker_processes 1;
error_log $work/logs/error.log;
pid $work/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$PORT;
    location / { return 200 "Hello World!"; }
  }
}
CONF
"$NGINX" -p "$work" -c "$work/nginx.conf"
for _ in $(seq 50); do
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
  sleep 0.1
done

echo "connections  wrk -t1 req/s  loadtest req/s  loadtest/wrk   (${DURATION}s each, nginx 1 worker, $(nproc) cores)"
for c in $CONNECTIONS; do
  wrk_rps=$(wrk -t1 -c"$c" -d"${DURATION}s" "http://127.0.0.1:$PORT/" | awk '/^Requests\/sec/ {print $2}')
  printf 'profiles:\n  - name: all\n    expected: unlimited\n    connections: %s\n' "$c" > "$work/profiles.yaml"
  "$LOADTEST" --url "http://127.0.0.1:$PORT/" --profiles "$work/profiles.yaml" --duration "${DURATION}s" \
    --settle 1s --no-progress --out "$work/out" >/dev/null
  ours=$(awk -F'\t' 'NR == 2 {printf "%.0f", $4 / ($3 / 1e6)}' "$work/out/results.tsv")
  awk -v c="$c" -v w="$wrk_rps" -v o="$ours" 'BEGIN {printf "%11d  %13.0f  %14.0f  %12.2f\n", c, w, o, o / w}'
done
