#!/usr/bin/env bash
# User-space instructions per request of `sluice serve` as a reverse proxy and of nginx as one
# (proxy_pass + limit_req), each on one thread, counted by valgrind's callgrind under the same
# wrk load: unlike CPU time on a shared VM, the count hardly moves between runs, so it shows
# what a change to the proxy's path costs and how far it is from nginx's. The kernel's share
# (the four socket calls of a forwarded request, about half the CPU time under bench/proxy.sh)
# is not counted.
#
# Both proxies are configured as in bench/proxy.sh (write_bench_config plus `upstream:`;
# write_nginx_proxy_config, run with `master_process off`) in front of one nginx upstream
# (write_nginx_upstream_config, not counted). Per account, each proxy runs under callgrind,
# wrk -t1 -c10 -d8s loads it, and the total is divided by the requests wrk counted (start-up,
# about 1-2% at these counts, included):
#   bench@example.com   admitted: every request forwarded
#   alice@example.com   at 1/s: nearly every answer the proxy's own 429
#
# With COUNT=syscalls, each proxy runs under `strace -f -c` instead, and the system calls it
# made per request are printed by name: the kernel's side of the comparison.
#
# Usage: bench/proxy-icount.sh [SLUICE_BINARY]   (default target/release/sluice; FIELDS=true
# or false as in bench/proxy.sh; COUNT=instructions or syscalls; UPSTREAM_PORT=18496,
# NGINX_PROXY_PORT=18497)
# Installs valgrind (or strace), wrk and nginx from Debian if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
BIN=${1:-target/release/sluice}
FIELDS=${FIELDS:-true}
COUNT=${COUNT:-instructions}
UPSTREAM_PORT=${UPSTREAM_PORT:-18496}
NGINX_PROXY_PORT=${NGINX_PROXY_PORT:-18497}
ACCOUNTS=(bench@example.com alice@example.com)

need=()
case "$COUNT" in
  instructions) command -v valgrind >/dev/null || need+=(valgrind) ;;
  syscalls) command -v strace >/dev/null || need+=(strace) ;;
  *) echo "bench/proxy-icount.sh: COUNT is instructions or syscalls, not '$COUNT'" >&2; exit 2 ;;
esac
command -v wrk >/dev/null || need+=(wrk)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
install_packages "${need[@]}"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$BIN" ] || cargo build --release -q -p sluice-cli

scratch
waits_for() { # url
  for _ in $(seq 300); do curl -s -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "bench/proxy-icount.sh: nothing answers $1" >&2
  exit 1
}

write_nginx_upstream_config "$tmp/upstream" "$UPSTREAM_PORT" 1
"$NGINX" -p "$tmp/upstream" -c "$tmp/upstream/nginx.conf" -g 'daemon off;' 2>"$tmp/upstream.err" &
pids+=($!)
waits_for "http://127.0.0.1:$UPSTREAM_PORT/"

write_bench_config "$tmp/sluice.yaml"
echo "upstream: {url: 'http://127.0.0.1:$UPSTREAM_PORT', max_idle: 100}" >>"$tmp/sluice.yaml"
echo "headers: $FIELDS" >>"$tmp/sluice.yaml"
write_nginx_proxy_config "$tmp/nginx" "$NGINX_PROXY_PORT" "$UPSTREAM_PORT" 100 1

# Runs a proxy's command under the counting tool, writing FILE (in place of the shell a
# background call starts, so $! is the tool's process).
counted() { # file command...
  local file=$1
  shift
  if [ "$COUNT" = syscalls ]; then
    exec strace -f -c -o "$file" "$@"
  else
    exec valgrind --tool=callgrind --callgrind-out-file="$file" "$@"
  fi
}

# Loads the proxy PID (under the counting tool, writing FILE) at URL as ACCOUNT, stops it and
# prints its count per request.
count() { # name pid file url account
  local requests total target
  requests=$(wrk -t1 -c10 -d8s -H "X-Account-ID: $5" "$4" | awk '/requests in/ {print $1}')
  # sluice drains on INT; nginx without a master stops at once on TERM. Either tool writes its
  # file as the process ends; under strace the proxy is strace's child.
  target=$2
  [ "$COUNT" = syscalls ] && target=$(pgrep -P "$2")
  if [ "$1" = sluice ]; then kill -INT "$target"; else kill -TERM "$target"; fi
  wait "$2" || true
  if [ "$COUNT" = syscalls ]; then
    echo "$1 proxy, $5: $requests requests, system calls per request ($3):"
    awk -v n="$requests" '$4 ~ /^[0-9]+$/ && $NF != "total" && $4 / n >= 0.01 {
      printf "  %-14s %6.2f\n", $NF, $4 / n }' "$3" | sort -k2 -n -r
    return
  fi
  total=$(awk '/^(summary|totals):/ {print $2; exit}' "$3")
  echo "$1 proxy, $5: $requests requests, $((total / requests)) instructions per request ($3)"
}

for account in "${ACCOUNTS[@]}"; do
  file="$tmp/sluice-$account.$COUNT"
  counted "$file" \
    "$BIN" serve --config "$tmp/sluice.yaml" --threads 1 --listen 127.0.0.1:0 \
    >"$tmp/sluice.out" 2>"$tmp/sluice.err" &
  pid=$!
  url=$(listening_url "$tmp/sluice.out" "$tmp/sluice.err" 300)
  count sluice "$pid" "$file" "$url/" "$account"

  file="$tmp/nginx-$account.$COUNT"
  counted "$file" \
    "$NGINX" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" -g 'daemon off; master_process off;' \
    >"$tmp/nginx.out" 2>"$tmp/nginx.err" &
  pid=$!
  waits_for "http://127.0.0.1:$NGINX_PROXY_PORT/"
  count nginx "$pid" "$file" "http://127.0.0.1:$NGINX_PROXY_PORT/" "$account"
done
