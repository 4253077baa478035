#!/usr/bin/env bash
# Decisions per second of sluice's rate-limit service against throttlecrab-server, all on
# 127.0.0.1, with clients neither project wrote:
#   gRPC   h2load (nghttp2-client) posting one prebuilt, length-prefixed protobuf request:
#          sluice's Envoy RLS v3 ShouldRateLimit and throttlecrab's Throttle
#   HTTP   wrk with a Lua POST body: sluice's POST /v1/check and throttlecrab's POST /throttle
# for one hot key, and (HTTP only) 100 000 distinct keys, each request's key drawn at random
# by wrk's Lua. h2load sends the same body on every request, so over gRPC only the hot key is
# measured. Every limit is far above what the run can reach: each answer is an admission, and
# both servers count it (sluice: a token bucket at 1e9/s, burst 1e6, with its RLS answer's
# default rate-limit headers; throttlecrab: GCRA at 1e9 per second, burst 1e6).
#
# Per case: the median over rounds of decisions/s, the client's p50/p99 latency (wrk's
# distribution; for h2load, from its per-request log), the server's CPU time per decision
# (user + system, from /proc), and the median over rounds of sluice/throttlecrab. Rounds
# interleave the servers so drift hits both alike. A round with any error (non-2xx, a failed
# or errored h2load request, a gRPC status other than OK at the check before the run) stops
# the script.
#
# With BASELINE=REV (a git revision) the same run also measures that revision's sluice (built
# under target/baseline) on the two hot-key cases, and prints this build over it: a change's
# cost as a ratio taken in one run (`BASELINE=HEAD~3 bench/service.sh`).
#
# Workers: WORKERS=1 (the default): each server runs one worker (`sluice serve --threads 1`,
# throttlecrab with TOKIO_WORKER_THREADS=1), so on a 2-core machine the server has a core and
# the client the other; WORKERS=all: each runs one per core, sharing them with the client.
#
# Usage: bench/service.sh [ROUNDS]   (default 3; DURATION=10s, CONNECTIONS=100 for wrk,
# H2_CONNECTIONS=10 and H2_STREAMS=10 for h2load, WORKERS=1, BASELINE in the environment)
# Installs wrk, nghttp2-client and protobuf-compiler from Debian if missing (needs root or
# sudo), and throttlecrab-server with `cargo install --root target/bench-tools`.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh

ROUNDS=${1:-3}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-100}
H2_CONNECTIONS=${H2_CONNECTIONS:-10}
H2_STREAMS=${H2_STREAMS:-10}
WORKERS=${WORKERS:-1}
PORT=${PORT:-18690} # sluice: PORT (its demo), +1 RLS, +2 check API; throttlecrab: +3 HTTP, +4 gRPC;
# the baseline: +5, +6 RLS, +7 check API
THROTTLECRAB_VERSION=0.4.40
case "$WORKERS" in
  1) sluice_threads=(--threads 1); tokio_workers=1 ;;
  all) sluice_threads=(); tokio_workers=$(nproc) ;;
  *) echo "bench/service.sh: WORKERS must be 1 or all, not '$WORKERS'" >&2; exit 2 ;;
esac
seconds=${DURATION%s}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "bench/service.sh: DURATION must be whole seconds, like 10s" >&2; exit 2; }

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v protoc >/dev/null || need+=(protobuf-compiler)
install_packages "${need[@]}"
THROTTLECRAB=target/bench-tools/bin/throttlecrab-server
if [ ! -x "$THROTTLECRAB" ]; then
  echo "installing throttlecrab-server $THROTTLECRAB_VERSION into target/bench-tools (a few minutes)"
  cargo install -q throttlecrab-server --version "$THROTTLECRAB_VERSION" --locked --root target/bench-tools
fi
cargo build --release -q -p sluice-cli
SLUICE=target/release/sluice

scratch

# sluice: the service on one key-only rule, so each user has a counter of its own.
cat >"$tmp/rules.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: {quota: "1000000000/s burst 1000000"}
YAML
cat >"$tmp/sluice.yaml" <<YAML
listen: 127.0.0.1:$PORT
capacity: 1000000
rules: rules.yaml
rls: {listen: 127.0.0.1:$((PORT + 1))}
api: {listen: 127.0.0.1:$((PORT + 2))}
YAML
"$SLUICE" serve "${sluice_threads[@]}" --config "$tmp/sluice.yaml" >"$tmp/sluice.out" 2>"$tmp/sluice.err" &
sluice_pid=$!
pids+=("$sluice_pid")
listening_url "$tmp/sluice.out" "$tmp/sluice.err" >/dev/null
if [ -n "${BASELINE:-}" ]; then
  BASELINE_BIN=$(baseline_binary "$BASELINE")
  sed -e "s/:$PORT\$/:$((PORT + 5))/" -e "s/:$((PORT + 1))}/:$((PORT + 6))}/" -e "s/:$((PORT + 2))}/:$((PORT + 7))}/" \
    "$tmp/sluice.yaml" >"$tmp/baseline.yaml"
  "$BASELINE_BIN" serve "${sluice_threads[@]}" --config "$tmp/baseline.yaml" >"$tmp/baseline.out" 2>"$tmp/baseline.err" &
  baseline_pid=$!
  pids+=("$baseline_pid")
  listening_url "$tmp/baseline.out" "$tmp/baseline.err" >/dev/null
fi

TOKIO_WORKER_THREADS=$tokio_workers "$THROTTLECRAB" --http --http-host 127.0.0.1 --http-port $((PORT + 3)) \
  --grpc --grpc-host 127.0.0.1 --grpc-port $((PORT + 4)) --store-capacity 1000000 --log-level warn \
  >"$tmp/throttlecrab.out" 2>&1 &
crab_pid=$!
pids+=("$crab_pid")
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$((PORT + 3))/health" && break; sleep 0.1; done

# The gRPC bodies: a protobuf message behind gRPC's 5-byte prefix (uncompressed, length).
python3 - "$tmp" <<'PY'
import struct, sys
def varint(n):
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([low])
        out += bytes([low | 0x80])
def text(number, value):
    data = value.encode()
    return varint(number << 3 | 2) + varint(len(data)) + data
def number(number, value):
    return varint(number << 3) + varint(value)
def message(number, body):
    return varint(number << 3 | 2) + varint(len(body)) + body
def framed(body):
    return b"\0" + struct.pack(">I", len(body)) + body
# envoy.service.ratelimit.v3.RateLimitRequest: domain 1, descriptors 2 (entries 1: key 1,
# value 2), hits_addend 3.
rls = text(1, "bench") + message(2, message(1, text(1, "user") + text(2, "hot"))) + number(3, 1)
# throttlecrab.ThrottleRequest: key 1, max_burst 2, count_per_period 3, period 4, quantity 5.
crab = text(1, "hot") + number(2, 1000000) + number(3, 1000000000) + number(4, 1) + number(5, 1)
open(sys.argv[1] + "/sluice.grpc", "wb").write(framed(rls))
open(sys.argv[1] + "/throttlecrab.grpc", "wb").write(framed(crab))
PY

# The wrk scripts: one body, or a random user of 100 000 per request.
wrk_script() { # file json_format_with_%d_or_not distinct
  cat >"$1" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local distinct = $3
local format = '$2'
if distinct then
  request = function()
    return wrk.format(nil, nil, nil, string.format(format, math.random(0, 99999)))
  end
else
  wrk.body = string.format(format, 0)
end
LUA
}
sluice_json='{"domain":"bench","descriptors":[{"entries":[{"key":"user","value":"u%d"}]}]}'
crab_json='{"key":"u%d","max_burst":1000000,"count_per_period":1000000000,"period":1}'
wrk_script "$tmp/sluice-hot.lua" "$sluice_json" false
wrk_script "$tmp/sluice-100k.lua" "$sluice_json" true
wrk_script "$tmp/crab-hot.lua" "$crab_json" false
wrk_script "$tmp/crab-100k.lua" "$crab_json" true

RLS_URL="http://127.0.0.1:$((PORT + 1))/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
CRAB_GRPC_URL="http://127.0.0.1:$((PORT + 4))/throttlecrab.RateLimiter/Throttle"
API_URL="http://127.0.0.1:$((PORT + 2))/v1/check"
CRAB_HTTP_URL="http://127.0.0.1:$((PORT + 3))/throttle"

# One gRPC call with curl, which shows the trailers: refuse to measure a server that answers
# anything but grpc-status 0.
check_grpc() { # url body
  local head
  head=$(curl -s --http2-prior-knowledge -D - -o /dev/null --data-binary "@$2" \
    -H 'content-type: application/grpc' -H 'te: trailers' "$1")
  grep -qi '^grpc-status: 0' <<<"$head" || { echo "bench/service.sh: $1 did not answer grpc-status 0:" >&2; echo "$head" >&2; exit 1; }
}
check_http() { # url json
  local status
  status=$(curl -s -o "$tmp/answer" -w '%{http_code}' -H 'content-type: application/json' -d "$2" "$1")
  [ "$status" = 200 ] || { echo "bench/service.sh: $1 answered $status: $(cat "$tmp/answer")" >&2; exit 1; }
}
check_grpc "$RLS_URL" "$tmp/sluice.grpc"
check_grpc "$CRAB_GRPC_URL" "$tmp/throttlecrab.grpc"
# shellcheck disable=SC2059 # the JSON formats are printf formats
check_http "$API_URL" "$(printf "$sluice_json" 1)"
# shellcheck disable=SC2059
check_http "$CRAB_HTTP_URL" "$(printf "$crab_json" 1)"

HZ=$(getconf CLK_TCK)
# name|kind|target|body or script|pid
cases=(
  "sluice RLS gRPC, hot key|h2|$RLS_URL|$tmp/sluice.grpc|$sluice_pid"
  "throttlecrab gRPC, hot key|h2|$CRAB_GRPC_URL|$tmp/throttlecrab.grpc|$crab_pid"
  "sluice /v1/check, hot key|wrk|$API_URL|$tmp/sluice-hot.lua|$sluice_pid"
  "throttlecrab /throttle, hot key|wrk|$CRAB_HTTP_URL|$tmp/crab-hot.lua|$crab_pid"
  "sluice /v1/check, 100k keys|wrk|$API_URL|$tmp/sluice-100k.lua|$sluice_pid"
  "throttlecrab /throttle, 100k keys|wrk|$CRAB_HTTP_URL|$tmp/crab-100k.lua|$crab_pid"
)
if [ -n "${BASELINE:-}" ]; then
  BASE_RLS_URL="http://127.0.0.1:$((PORT + 6))/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
  BASE_API_URL="http://127.0.0.1:$((PORT + 7))/v1/check"
  check_grpc "$BASE_RLS_URL" "$tmp/sluice.grpc"
  cases+=(
    "$BASELINE RLS gRPC, hot key|h2|$BASE_RLS_URL|$tmp/sluice.grpc|$baseline_pid"
    "$BASELINE /v1/check, hot key|wrk|$BASE_API_URL|$tmp/sluice-hot.lua|$baseline_pid"
  )
fi

# Prints "decisions/s p50_ms p99_ms decisions" for one run; exits on any error.
run_h2() { # url body seconds
  local out log
  log="$tmp/h2.log"
  rm -f "$log"
  out=$(h2load -D "$3" -c "$H2_CONNECTIONS" -m "$H2_STREAMS" -t 1 -d "$2" \
    -H 'content-type: application/grpc' -H 'te: trailers' --log-file="$log" "$1")
  local done_ok failed errored
  read -r done_ok failed errored < <(awk '/^requests:/ {print $8, $10, $12}' <<<"$out")
  if [ "${failed:-1}" != 0 ] || [ "${errored:-1}" != 0 ] || ! grep -q '^status codes: [0-9]* 2xx, 0 3xx, 0 4xx, 0 5xx' <<<"$out"; then
    echo "bench/service.sh: h2load against $1 saw errors:" >&2
    echo "$out" >&2
    exit 1
  fi
  # The log's third column is each request's time in microseconds.
  local rps
  rps=$(awk '/^finished in/ {print $4}' <<<"$out")
  sort -n -k3,3 "$log" | awk -v rps="$rps" -v n="$done_ok" '
    {t[NR] = $3}
    END {printf "%s %.3f %.3f %d\n", rps, t[int(NR * 0.5) + 1] / 1000, t[int(NR * 0.99) + 1] / 1000, n}'
}
run_wrk() { # url script duration
  local out
  out=$(wrk -t1 -c"$CONNECTIONS" -d"$3" --latency -s "$2" "$1")
  if grep -q 'Non-2xx\|Socket errors' <<<"$out"; then
    echo "bench/service.sh: wrk against $1 saw errors:" >&2
    echo "$out" >&2
    exit 1
  fi
  local ms='function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }'
  awk "$ms"' /^Requests\/sec:/ {rps = $2} /requests in/ {n = $1}
    $1 == "50.000%" || $1 == "50%" {p50 = ms($2)} $1 == "99.000%" || $1 == "99%" {p99 = ms($2)}
    END {printf "%s %.3f %.3f %d\n", rps, p50, p99, n}' <<<"$out"
}
measure() { # case seconds -> "rps p50 p99 n cpu_us"
  local kind target body pid before after line
  IFS='|' read -r _ kind target body pid <<<"$1"
  before=$(ticks "$pid")
  case $kind in
    h2) line=$(run_h2 "$target" "$body" "$2") ;;
    wrk) line=$(run_wrk "$target" "$body" "$2s") ;;
  esac
  after=$(ticks "$pid")
  awk -v t="$((after - before))" -v hz="$HZ" '{printf "%s %.2f\n", $0, t * 1e6 / hz / $4}' <<<"$line"
}

# Warm up each case (and fill the 100k keys' counters), then measure in interleaved rounds.
for c in "${cases[@]}"; do measure "$c" 2 >/dev/null; done
echo "h2load -c$H2_CONNECTIONS -m$H2_STREAMS -t1, wrk -t1 -c$CONNECTIONS, ${seconds}s runs, $ROUNDS rounds, $(nproc) cores, WORKERS=$WORKERS"
for round in $(seq "$ROUNDS"); do
  for i in "${!cases[@]}"; do
    IFS='|' read -r name _ <<<"${cases[$i]}"
    read -r rps p50 p99 n cpu < <(measure "${cases[$i]}" "$seconds")
    echo "$i $rps $p50 $p99 $n $cpu $round" >>"$tmp/results"
    printf '  round %d  %-34s %10s /s  p50 %7s ms  p99 %7s ms  %6s us CPU/decision\n' \
      "$round" "$name" "$rps" "$p50" "$p99" "$cpu"
  done
done

# The median of field F of case I over rounds; and of sluice's ratio to throttlecrab's (case
# I+1) within each round.
of() { awk -v i="$1" -v f="$2" '$1 == i {print $f}' "$tmp/results" | median; }
ratio() {
  awk -v i="$1" -v f="$2" '$1 == i {s[$7] = $f} $1 == i + 1 {c[$7] = $f} END {for (r in s) print s[r] / c[r]}' \
    "$tmp/results" | median
}
echo
printf '| %-34s | %12s | %8s | %8s | %17s | %15s | %15s |\n' \
  "case" "decisions/s" "p50 ms" "p99 ms" "us CPU / decision" "sluice/crab d/s" "sluice/crab CPU"
printf '|%s|%s|%s|%s|%s|%s|%s|\n' "------------------------------------" "-------------:" \
  "---------:" "---------:" "------------------:" "----------------:" "----------------:"
for i in "${!cases[@]}"; do
  IFS='|' read -r name _ <<<"${cases[$i]}"
  if ((i % 2 == 0 && i < 6)); then
    speed=$(printf '%.2f' "$(ratio "$i" 2)")
    cost=$(printf '%.2f' "$(ratio "$i" 6)")
  else
    speed="" cost=""
  fi
  printf '| %-34s | %12.0f | %8.3f | %8.3f | %17.2f | %15s | %15s |\n' \
    "$name" "$(of "$i" 2)" "$(of "$i" 3)" "$(of "$i" 4)" "$(of "$i" 6)" "$speed" "$cost"
done
if [ -n "${BASELINE:-}" ]; then
  # This build over the baseline's, within each round: RLS (case 0 / 6), check API (2 / 7).
  of_pair() { # now base field
    awk -v a="$1" -v b="$2" -v f="$3" '$1 == a {x[$7] = $f} $1 == b {y[$7] = $f} END {for (r in x) print x[r] / y[r]}' \
      "$tmp/results" | median
  }
  echo
  for pair in "0 6 RLS" "2 7 check API"; do
    read -r now base what <<<"$pair"
    echo "$what, this build / $BASELINE (median over rounds): decisions/s $(of_pair "$now" "$base" 2), CPU per decision $(of_pair "$now" "$base" 6)"
  done
fi
