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
#   With NGINX=1, also nginx's own count for the denied account under the same wrk run:
#   one process (`master_process off`), `limit_req` at 1r/s with its refusals not logged,
#   as in bench/http.sh (installs nginx-light if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
BIN=${1:-target/release/sluice}
shift || true
ACCOUNTS=("$@")
[ ${#ACCOUNTS[@]} -gt 0 ] || ACCOUNTS=(admin@example.com alice@example.com)

need=()
command -v valgrind >/dev/null || need+=(valgrind)
command -v wrk >/dev/null || need+=(wrk)
NGINX_BIN=$(command -v nginx || echo /usr/sbin/nginx)
[ -z "${NGINX:-}" ] || [ -x "$NGINX_BIN" ] || need+=(nginx-light)
install_packages "${need[@]}"
[ -x "$BIN" ] || cargo build --release -q -p sluice-cli

out=${OUT:-target/serve-icount}
mkdir -p "$out"
write_bench_config "$out/sluice.yaml"
for account in "${ACCOUNTS[@]}"; do
  file="$out/$account.callgrind"
  valgrind --tool=callgrind --callgrind-out-file="$file" \
    "$BIN" serve --config "$out/sluice.yaml" --threads 1 --listen 127.0.0.1:0 \
    >"$out/$account.out" 2>"$out/$account.err" &
  pid=$!
  url=$(listening_url "$out/$account.out" "$out/$account.err" 300)
  requests=$(wrk -t1 -c10 -d8s -H "X-Account-ID: $account" "$url/" | awk '/requests in/ {print $1}')
  kill -INT "$pid"
  wait "$pid" || true
  total=$(awk '/^(summary|totals):/ {print $2; exit}' "$file")
  # Start-up (about 1% of the total at these request counts) is included.
  echo "$account: $requests requests, $((total / requests)) instructions per request ($file)"
done
if [ -n "${NGINX:-}" ]; then
  port=${NGINX_PORT:-18584}
  dir="$PWD/$out/nginx"
  mkdir -p "$dir/logs"
  cat >"$dir/nginx.conf" <<CONF
daemon off;
master_process off;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 100000000;
  limit_req_zone \$http_x_account_id zone=accounts:10m rate=1r/s;
  server {
    listen 127.0.0.1:$port;
    limit_req_status 429;
    limit_req_log_level info;
    location / { limit_req zone=accounts; try_files /nonexistent @hello; }
    location @hello { return 200 "Hello World!"; }
  }
}
CONF
  file="$out/nginx.callgrind"
  valgrind --tool=callgrind --callgrind-out-file="$file" \
    "$NGINX_BIN" -p "$dir" -c "$dir/nginx.conf" >"$out/nginx.out" 2>"$out/nginx.err" &
  pid=$!
  for _ in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
  requests=$(wrk -t1 -c10 -d8s -H "X-Account-ID: alice@example.com" "http://127.0.0.1:$port/" | awk '/requests in/ {print $1}')
  # Without a master, TERM stops at once; callgrind writes its file then.
  kill -TERM "$pid"
  wait "$pid" || true
  total=$(awk '/^(summary|totals):/ {print $2; exit}' "$file")
  echo "nginx limit_req (alice@example.com): $requests requests, $((total / requests)) instructions per request ($file)"
fi
