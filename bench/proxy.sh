#!/usr/bin/env bash
# `sluice serve` as a rate-limiting reverse proxy (config `upstream:`) against nginx as one
# (proxy_pass + limit_req), all on 127.0.0.1, with the demo's wrk run (wrk -t1 -c100 -d10s).
# Both proxies forward to the same upstream, an nginx of its own (one worker, no logs) answering
# `return 200 "Hello World!"`, over kept-alive connections. One run measures, in interleaved
# rounds:
#   sluice proxy, admitted   bench@example.com, whose quota no run reaches: every request
#                            forwarded, every answer the upstream's 200 (with sluice's
#                            rate-limit fields added, as `sluice serve` does by default;
#                            nginx adds none: work sluice does and nginx does not)
#   nginx proxy, admitted    the same account through nginx
#   sluice proxy, denied     alice@example.com at 1/s, as in the demo's wrk run: nearly every
#                            answer sluice's own 429, never forwarded
#   nginx proxy, denied      the same account through nginx (limit_req_status 429)
# and prints per case the median over rounds of requests/s, the proxy's CPU time per request
# (its own process only: the upstream's is left out, and printed apart for the admitted cases)
# and wrk's p99 latency, then sluice / nginx (each round's ratio, the median over rounds) for
# the admitted and the denied case.
#
# The same work on both sides: one limit check per request, and only admitted requests
# forwarded. sluice has the benchmarks' config (write_bench_config) plus `upstream:`. nginx has
# a limit_req zone per quota, each keyed (through a map) by X-Account-ID for its account alone
# and by "" (which limit_req skips) for anyone else: alice@example.com at 1r/s as in http.sh,
# bench@example.com at 1000000000r/s with a burst as large and nodelay (without a burst, a
# second request within the same millisecond would be refused: nginx counts time in ms).
# Refusals are not logged (limit_req_log_level info under error_log warn), no access log.
# nginx writes the forwarding headers sluice writes (X-Forwarded-For, Forwarded,
# X-Forwarded-Proto) and passes Host as the client sent it, as sluice does by default.
#
# Both keep upstream connections alive, at most POOL idle ones each: sluice's
# `upstream.max_idle`, nginx's `keepalive` in its `upstream` block (with HTTP/1.1 and
# `Connection ""`). POOL is CONNECTIONS by default, so both can keep every connection a run
# has busy at once (sluice's default, 256, would do too). With fewer (POOL=64: nginx gets
# keepalive 64), each closes the surplus as answers come back and connects again later: at
# -c100 one new upstream connection every 6 to 20 requests, on both sides, and the run
# measures connection setup as much as forwarding. The "upstream conns" column, the
# connections the upstream accepted in a run, shows it (with POOL=CONNECTIONS, a few at most:
# a proxy closes the connections of the requests wrk cuts off when it stops).
#
# Each row shows too how many requests a second the upstream answered (admitted: about the
# proxy's req/s, a little over as the requests in flight when wrk stops are forwarded but not
# counted; denied: about 1, alice's quota), so a proxy that forwards what it refuses shows
# there; and the share of non-2xx answers (admitted: 0, or the proxy failed some; denied:
# about 100%).
#
# Workers: with WORKERS=1 (the default) each proxy runs one worker (`sluice serve --threads 1`,
# nginx `worker_processes 1`); with WORKERS=all one per core (sluice's default, nginx
# `worker_processes auto`). The upstream runs UPSTREAM_WORKERS (default 1) in either case.
# While a run forwards, wrk, the proxy and the upstream all want a core: on a 2-core machine
# they share them, alike for both proxies; CPU time per request is the steadier figure.
#
# Fields: with FIELDS=true (the default) sluice adds its rate-limit fields to every admitted
# answer (`headers: true`, as `sluice serve` does unless told not to); with FIELDS=false it
# does not (`headers: false`), and both proxies write the same headers.
#
# Usage: bench/proxy.sh [ROUNDS]   (default 5; DURATION=10s, CONNECTIONS=100, WORKERS=1, FIELDS=true,
# POOL=CONNECTIONS, UPSTREAM_WORKERS=1, UPSTREAM_PORT=18491, NGINX_PROXY_PORT=18492 in the
# environment)
# Installs wrk and nginx from Debian if missing (needs root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh

ROUNDS=${1:-5}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-100}
UPSTREAM_PORT=${UPSTREAM_PORT:-18491}
NGINX_PROXY_PORT=${NGINX_PROXY_PORT:-18492}
POOL=${POOL:-$CONNECTIONS}
UPSTREAM_WORKERS=${UPSTREAM_WORKERS:-1}
WORKERS=${WORKERS:-1}
FIELDS=${FIELDS:-true}
case "$FIELDS" in
  true | false) ;;
  *) echo "bench/proxy.sh: FIELDS must be true or false, not '$FIELDS'" >&2; exit 2 ;;
esac
case "$WORKERS" in
  1) sluice_threads=(--threads 1); nginx_workers=1 ;;
  all) sluice_threads=(); nginx_workers=auto ;;
  *) echo "bench/proxy.sh: WORKERS must be 1 or all, not '$WORKERS'" >&2; exit 2 ;;
esac

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
install_packages "${need[@]}"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

cargo build --release -q -p sluice-cli
SLUICE=target/release/sluice

scratch

# Starts an nginx on the config $tmp/NAME/nginx.conf and waits until URL answers; sets
# master (its master process's pid).
start_nginx() { # name url
  mkdir -p "$tmp/$1/logs"
  "$NGINX" -p "$tmp/$1" -c "$tmp/$1/nginx.conf" -g 'daemon off;' 2>"$tmp/$1/stderr" &
  master=$!
  pids+=("$master")
  for _ in $(seq 100); do curl -s -o /dev/null "$2" && return 0; sleep 0.1; done
  echo "bench/proxy.sh: nginx ($1) did not start:" >&2
  cat "$tmp/$1/stderr" "$tmp/$1/logs/error.log" >&2 2>/dev/null || true
  exit 1
}

# The upstream (write_nginx_upstream_config): its stub_status counts what it gets.
UPSTREAM_STATUS=http://127.0.0.1:$UPSTREAM_PORT/upstream-status
write_nginx_upstream_config "$tmp/upstream" "$UPSTREAM_PORT" "$UPSTREAM_WORKERS"
start_nginx upstream "$UPSTREAM_STATUS"
upstream_workers=$(pgrep -P "$master" | tr '\n' ' ')

# nginx as the proxy (write_nginx_proxy_config, the zones described at the top).
write_nginx_proxy_config "$tmp/nginx" "$NGINX_PROXY_PORT" "$UPSTREAM_PORT" "$POOL" "$nginx_workers"
NGINX_URL=http://127.0.0.1:$NGINX_PROXY_PORT/
start_nginx nginx "$NGINX_URL"
nginx_pids=$(pgrep -P "$master" | tr '\n' ' ')

# sluice as the proxy: the benchmarks' config, forwarding to the upstream.
write_bench_config "$tmp/sluice.yaml"
echo "upstream: {url: 'http://127.0.0.1:$UPSTREAM_PORT', max_idle: $POOL}" >>"$tmp/sluice.yaml"
echo "headers: $FIELDS" >>"$tmp/sluice.yaml"
"$SLUICE" serve "${sluice_threads[@]}" --config "$tmp/sluice.yaml" --listen 127.0.0.1:0 \
  >"$tmp/sluice.out" 2>"$tmp/sluice.err" &
sluice_pid=$!
pids+=("$sluice_pid")
SLUICE_URL=$(listening_url "$tmp/sluice.out" "$tmp/sluice.err")/

# The upstream's counts: "connections_accepted requests", each including the status request
# itself.
upstream_counts() {
  curl -s "$UPSTREAM_STATUS" | awk 'prev ~ /accepts/ {print $1, $3} {prev = $0}'
}
# Refuses to measure a proxy that does not answer as expected: the admitted account's request
# answered 200 "Hello World!" and forwarded (the upstream counts it), and the denied account's
# second request at once answered 429 and not forwarded.
check_proxy() { # name url
  local r0 r1 status body
  read -r _ r0 < <(upstream_counts)
  body=$(curl -s -o - -w '\n%{http_code}' -H 'X-Account-ID: bench@example.com' "$2")
  read -r _ r1 < <(upstream_counts)
  status=${body##*$'\n'}
  body=${body%$'\n'*}
  if [ "$status" != 200 ] || [ "$body" != "Hello World!" ] || [ $((r1 - r0)) != 2 ]; then
    echo "bench/proxy.sh: $1 answered bench@example.com $status '$body', the upstream counting $((r1 - r0 - 1)) request(s) (expected 200 'Hello World!', 1)" >&2
    exit 1
  fi
  curl -s -o /dev/null -H 'X-Account-ID: alice@example.com' "$2"
  read -r _ r0 < <(upstream_counts)
  status=$(curl -s -o /dev/null -w '%{http_code}' -H 'X-Account-ID: alice@example.com' "$2")
  read -r _ r1 < <(upstream_counts)
  if [ "$status" != 429 ] || [ $((r1 - r0)) != 1 ]; then
    echo "bench/proxy.sh: $1 answered alice@example.com's second request $status, the upstream counting $((r1 - r0 - 1)) request(s) (expected 429, 0)" >&2
    exit 1
  fi
}
check_proxy sluice "$SLUICE_URL"
check_proxy nginx "$NGINX_URL"

HZ=$(getconf CLK_TCK)
# name|url|account|proxy pids. Pairs: sluice's case I, nginx's I + 1.
cases=(
  "sluice proxy, admitted|$SLUICE_URL|bench@example.com|$sluice_pid"
  "nginx proxy, admitted|$NGINX_URL|bench@example.com|$nginx_pids"
  "sluice proxy, denied|$SLUICE_URL|alice@example.com|$sluice_pid"
  "nginx proxy, denied|$NGINX_URL|alice@example.com|$nginx_pids"
)

# Warm up each case once (and fill both pools), then measure in interleaved rounds so drift
# hits all alike; within each pair, sluice goes first in odd rounds and nginx in even ones.
for c in "${cases[@]}"; do
  IFS='|' read -r _ url account _ <<<"$c"
  wrk -t1 -c"$CONNECTIONS" -d2s -H "X-Account-ID: $account" "$url" >/dev/null
done
if command -v lscpu >/dev/null; then
  LC_ALL=C lscpu | awk -F':[ \t]*' '/^(Model name|L1d cache|L1i cache|L2 cache|L3 cache):/ {
    line = line (line ? "; " : "") $1 ": " $2} END {if (line) print line}'
fi
echo "wrk -t1 -c$CONNECTIONS -d$DURATION --latency, $ROUNDS rounds, $(nproc) cores, WORKERS=$WORKERS," \
  "upstream: nginx, $UPSTREAM_WORKERS worker(s); idle upstream connections kept $POOL; sluice's fields $FIELDS"
ms='function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }'
for round in $(seq "$ROUNDS"); do
  if ((round % 2)); then order=(0 1 2 3); else order=(1 0 3 2); fi
  for i in "${order[@]}"; do
    IFS='|' read -r name url account pid <<<"${cases[$i]}"
    read -r acc0 req0 < <(upstream_counts)
    before=$(ticks "$pid")
    up_before=$(ticks "$upstream_workers")
    out=$(wrk -t1 -c"$CONNECTIONS" -d"$DURATION" --latency -H "X-Account-ID: $account" "$url")
    after=$(ticks "$pid")
    up_after=$(ticks "$upstream_workers")
    read -r acc1 req1 < <(upstream_counts)
    read -r rps total non2xx errors p99 < <(awk "$ms"'
      /^Requests\/sec:/ {rps = $2} /requests in/ {n = $1} /Non-2xx/ {bad = $5}
      /Socket errors/ {gsub(/,/, ""); errors = $4 + $6 + $8 + $10}
      $1 == "99.000%" || $1 == "99%" {p99 = ms($2)}
      END {printf "%s %d %d %d %.3f\n", rps, n, bad, errors, p99}' <<<"$out")
    forwarded=$((req1 - req0 - 1))
    opened=$((acc1 - acc0 - 1))
    cpu=$(awk -v t="$((after - before))" -v hz="$HZ" -v n="$total" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
    up_cpu=$(awk -v t="$((up_after - up_before))" -v hz="$HZ" -v n="$forwarded" \
      'BEGIN {printf "%.2f", (n > 0) ? t * 1e6 / hz / n : 0}')
    echo "$i $rps $total $non2xx $cpu $p99 $forwarded $opened $up_cpu $errors $round" >>"$tmp/results"
    note=""
    ((errors == 0)) || note=", $errors socket errors"
    printf '  round %d  %-22s %10s req/s  %6s us CPU/req  p99 %8s ms  %s non-2xx, %s forwarded, %s upstream connections of %s%s\n' \
      "$round" "$name" "$rps" "$cpu" "$p99" "$non2xx" "$forwarded" "$opened" "$total" "$note"
  done
done

# Results' fields: 1 case, 2 req/s, 3 requests, 4 non-2xx, 5 us CPU/req, 6 p99 ms,
# 7 forwarded, 8 upstream connections, 9 upstream us CPU per forwarded request, 10 socket
# errors, 11 round.
of() { awk -v i="$1" -v f="$2" '$1 == i {print $f}' "$tmp/results" | median; }
share() { # case field: the field's total over all rounds, as a share of the requests sent
  awk -v i="$1" -v f="$2" '$1 == i {t += $3; n += $f} END {printf "%.2f%%", t ? 100 * n / t : 0}' "$tmp/results"
}
# Case I's requests forwarded a second (on wrk's clock: its req/s times the share forwarded),
# the median over rounds.
forwarded_rate() { awk -v i="$1" '$1 == i {print $3 ? $7 * $2 / $3 : 0}' "$tmp/results" | median; }
# Case I's field over case J's, within each round; the median over rounds.
ratio() { # i j field
  awk -v i="$1" -v j="$2" -v f="$3" '$1 == i {x[$11] = $f} $1 == j {y[$11] = $f}
    END {for (r in x) if (y[r] > 0) print x[r] / y[r]}' "$tmp/results" | median
}
echo
printf '| %-22s | %12s | %14s | %8s | %8s | %11s | %15s |\n' \
  "case" "median req/s" "us CPU per req" "p99 ms" "non-2xx" "forwarded/s" "upstream conns"
printf '|%s|%s|%s|%s|%s|%s|%s|\n' "------------------------" "-------------:" "---------------:" \
  "---------:" "---------:" "------------:" "----------------:"
for i in "${!cases[@]}"; do
  IFS='|' read -r name _ <<<"${cases[$i]}"
  printf '| %-22s | %12.0f | %14.2f | %8.3f | %8s | %11.1f | %15.0f |\n' "$name" "$(of "$i" 2)" \
    "$(of "$i" 5)" "$(of "$i" 6)" "$(share "$i" 4)" "$(forwarded_rate "$i")" "$(of "$i" 8)"
done
echo
for pair in "admitted 0 1" "denied 2 3"; do
  read -r what s n <<<"$pair"
  printf '%s, sluice / nginx (median over rounds): req/s %.3f, CPU per request %.3f, p99 %.3f\n' \
    "$what" "$(ratio "$s" "$n" 2)" "$(ratio "$s" "$n" 5)" "$(ratio "$s" "$n" 6)"
done
printf 'upstream (not counted above), us CPU per request it answered, admitted: via sluice %.2f, via nginx %.2f\n' \
  "$(of 0 9)" "$(of 1 9)"
errors=$(awk '{n += $10} END {print n + 0}' "$tmp/results")
((errors == 0)) || echo "wrk saw $errors socket errors in all (see the rounds above)"
