#!/usr/bin/env bash
# HTTP throughput of `sluice serve` against nginx, all on 127.0.0.1, with the demo's wrk run
# (wrk -t1 -c100 -d10s). One run measures, in interleaved rounds:
#   sluice limited, admitted   a limited account whose quota is never reached (every answer 200,
#                              with the rate-limit fields)
#   ... admitted, no fields    the same on a second sluice with `headers: false` (the limiter's
#                              own cost, without the fields' cost)
#   sluice limited, denied     alice@example.com at 1/s, as in the demo's wrk run (nearly every answer 429)
#   sluice bypass (control)    admin@example.com: the same server, the limiter skipped
#   nginx limit_req            limit_req keyed by X-Account-ID at 1r/s (nearly every answer 429),
#                              refusals not logged (limit_req_log_level info under error_log
#                              warn; before 2026-11-27 nginx wrote an error-log line for each)
#   nginx no limit             the same nginx, no limit_req
#   ... denied, metrics on     the denied case on a third sluice with its admin listener (every
#                              decision counted per rule and timed), with its ratio to the
#                              denied case without (the metrics' cost)
# and prints the median requests/s and server CPU time per request of each, with the median
# over rounds of its ratio to sluice's control in the same round.
#
# Workers: with WORKERS=1 (the default) each server runs one worker (`sluice serve --threads 1`,
# nginx `worker_processes 1`), so on a 2-core machine each has a core and wrk the other; with
# WORKERS=all each runs one per core (sluice's default, nginx `worker_processes auto`), and
# both then share their cores with wrk.
#
# With BASELINE=REV (a git revision) the same run also measures that revision's sluice
# (built into target/baseline) on the admitted and denied cases, so a change's cost is a
# ratio taken in one run: `BASELINE=HEAD~3 bench/http.sh`.
#
# Usage: bench/http.sh [ROUNDS]   (default 5; DURATION=10s, CONNECTIONS=100, WORKERS=1,
# BASELINE in the environment)
# Installs wrk and nginx from Debian if missing (needs root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh

ROUNDS=${1:-5}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-100}
NGINX_PORT=${NGINX_PORT:-18481}
NGINX_LIMITED_PORT=${NGINX_LIMITED_PORT:-18482}
WORKERS=${WORKERS:-1}
case "$WORKERS" in
  1) sluice_threads=(--threads 1); nginx_workers=1 ;;
  all) sluice_threads=(); nginx_workers=auto ;;
  *) echo "bench/http.sh: WORKERS must be 1 or all, not '$WORKERS'" >&2; exit 2 ;;
esac

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
install_packages "${need[@]}"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

cargo build --release -q -p sluice-cli
SLUICE=target/release/sluice

scratch

write_bench_config "$tmp/sluice.yaml"
{ cat "$tmp/sluice.yaml"; echo "headers: false"; } >"$tmp/sluice-no-fields.yaml"
{ cat "$tmp/sluice.yaml"; echo "admin: {listen: 127.0.0.1:0}"; } >"$tmp/sluice-metrics.yaml"
# Starts sluice with a config; sets url and pid.
start_sluice() {
  "$SLUICE" serve "${sluice_threads[@]}" --config "$tmp/$1.yaml" --listen 127.0.0.1:0 \
    >"$tmp/$1.out" 2>"$tmp/$1.err" &
  pid=$!
  pids+=("$pid")
  url=$(listening_url "$tmp/$1.out" "$tmp/$1.err")
}
start_sluice sluice
SLUICE_URL=$url; sluice_pid=$pid
start_sluice sluice-no-fields
NO_FIELDS_URL=$url; no_fields_pid=$pid
start_sluice sluice-metrics
METRICS_URL=$url; metrics_pid=$pid
if [ -n "${BASELINE:-}" ]; then
  # The revision's build, under target/baseline (kept between runs).
  BASELINE_BIN=$(baseline_binary "$BASELINE")
  cp "$tmp/sluice.yaml" "$tmp/baseline.yaml"
  SLUICE_NOW=$SLUICE; SLUICE=$BASELINE_BIN
  start_sluice baseline
  BASELINE_URL=$url; baseline_pid=$pid
  SLUICE=$SLUICE_NOW
fi

# nginx: $nginx_workers worker(s), no logs, the same two answers as sluice.
mkdir -p "$tmp/nginx/logs" "$tmp/nginx/html"
cat > "$tmp/nginx/nginx.conf" <<EOF
worker_processes $nginx_workers;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/logs/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 100000000;
  limit_req_zone \$http_x_account_id zone=accounts:10m rate=1r/s;
  # Neither server's measured path touches the file system. The control answers with
  # return. Under limit_req, return would run before the limit's phase and nothing would
  # be limited, so the few admitted requests (1/s) reach the answer through try_files and a
  # named location; the measured ones, denied, end in the limit's phase.
  server {
    listen 127.0.0.1:$NGINX_LIMITED_PORT;
    limit_req_status 429;
    # Refusals logged at info, below the error log's warn: nginx writes no line per refusal,
    # as sluice writes at most denied_log (5) a second.
    limit_req_log_level info;
    location / { limit_req zone=accounts; try_files /nonexistent @hello; }
    location @hello { return 200 "Hello World!"; }
  }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / { return 200 "Hello World!"; }
  }
}
EOF
"$NGINX" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" -g 'daemon off;' &
pids+=($!)
nginx_master=$!
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$NGINX_PORT/" && break; sleep 0.1; done
nginx_workers_pids=$(pgrep -P "$nginx_master" | tr '\n' ' ')

HZ=$(getconf CLK_TCK)

cases=(
  "sluice limited, admitted|$SLUICE_URL/|bench@example.com|$sluice_pid"
  "... admitted, no fields|$NO_FIELDS_URL/|bench@example.com|$no_fields_pid"
  "sluice limited, denied|$SLUICE_URL/|alice@example.com|$sluice_pid"
  "sluice bypass (control)|$SLUICE_URL/|admin@example.com|$sluice_pid"
  "nginx limit_req|http://127.0.0.1:$NGINX_LIMITED_PORT/|alice@example.com|$nginx_workers_pids"
  "nginx no limit|http://127.0.0.1:$NGINX_PORT/|alice@example.com|$nginx_workers_pids"
  "... denied, metrics on|$METRICS_URL/|alice@example.com|$metrics_pid"
)
if [ -n "${BASELINE:-}" ]; then
  cases+=(
    "$BASELINE: admitted|$BASELINE_URL/|bench@example.com|$baseline_pid"
    "$BASELINE: denied|$BASELINE_URL/|alice@example.com|$baseline_pid"
  )
fi

# Warm up each target once, then measure in interleaved rounds so drift hits all alike.
for c in "${cases[@]}"; do
  IFS='|' read -r _ url account _ <<<"$c"
  wrk -t1 -c"$CONNECTIONS" -d2s -H "X-Account-ID: $account" "$url" >/dev/null
done
echo "wrk -t1 -c$CONNECTIONS -d$DURATION, $ROUNDS rounds, $(nproc) cores, WORKERS=$WORKERS"
for round in $(seq "$ROUNDS"); do
  for i in "${!cases[@]}"; do
    IFS='|' read -r name url account pid <<<"${cases[$i]}"
    before=$(ticks "$pid")
    out=$(wrk -t1 -c"$CONNECTIONS" -d"$DURATION" -H "X-Account-ID: $account" "$url")
    after=$(ticks "$pid")
    rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
    total=$(awk '/requests in/ {print $1}' <<<"$out")
    non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out")
    cpu=$(awk -v t="$((after - before))" -v hz="$HZ" -v n="$total" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
    echo "$i $rps ${total:-0} ${non2xx:-0} $cpu $round" >>"$tmp/results"
    printf '  round %d  %-26s %10s req/s  %6s us CPU/req  %s non-2xx of %s\n' \
      "$round" "$name" "$rps" "$cpu" "${non2xx:-0}" "$total"
  done
done

# Ratios are taken within each round (the runs minutes apart see different load from other
# processes on the machine), then the median over rounds is reported.
ratios() {
  awk -v i="$1" -v f="$2" '$1 == 3 {c[$6] = $f} $1 == i {v[$6] = $f} END {for (r in v) print v[r] / c[r]}' \
    "$tmp/results" | median
}
echo
printf '| %-26s | %12s | %10s | %14s | %10s | %10s |\n' \
  "case" "median req/s" "vs control" "us CPU per req" "vs control" "non-2xx"
printf '|%s|%s|%s|%s|%s|%s|\n' "----------------------------" "-------------:" "-----------:" \
  "----------------:" "-----------:" "-----------:"
for i in "${!cases[@]}"; do
  IFS='|' read -r name _ _ _ <<<"${cases[$i]}"
  rps=$(awk -v i="$i" '$1 == i {print $2}' "$tmp/results" | median)
  cpu=$(awk -v i="$i" '$1 == i {print $5}' "$tmp/results" | median)
  share=$(awk -v i="$i" '$1 == i {t += $3; n += $4} END {printf "%.2f%%", t ? 100 * n / t : 0}' "$tmp/results")
  printf '| %-26s | %12.0f | %10.3f | %14.2f | %10.3f | %10s |\n' \
    "$name" "$rps" "$(ratios "$i" 2)" "$cpu" "$(ratios "$i" 5)" "$share"
done
metrics_cost=$(awk '$1 == 2 {off[$6] = $2} $1 == 6 {on[$6] = $2} END {for (r in on) print on[r] / off[r]}' \
  "$tmp/results" | median)
echo
echo "denied req/s with metrics on / off (median over rounds): $metrics_cost"
if [ -n "${BASELINE:-}" ]; then
  # This build over the baseline's, within each round: admitted (case 0 / 7), denied (2 / 8).
  for pair in "admitted 0 7" "denied 2 8"; do
    read -r what now base <<<"$pair"
    ratio=$(awk -v a="$now" -v b="$base" '$1 == a {x[$6] = $2} $1 == b {y[$6] = $2} END {for (r in x) print x[r] / y[r]}' \
      "$tmp/results" | median)
    echo "$what req/s, this build / $BASELINE (median over rounds): $ratio"
  done
fi
