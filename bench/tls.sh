#!/usr/bin/env bash
# What TLS costs `sluice serve` per request: the same server config with and without `tls:`,
# measured by wrk over kept-alive connections (the handshake is paid once per connection;
# what is measured is the record layer's cost on each request and answer), in interleaved
# rounds, admitted (bench@example.com, never limited) and denied (alice@example.com at 1/s).
# Prints median requests/s and server CPU time per request, and TLS / plaintext ratios.
#
# Usage: bench/tls.sh [ROUNDS]   (default 3; DURATION=10s, CONNECTIONS=100; one serving
# thread each). Needs wrk built with TLS (Debian's is) and the openssl command for the
# test certificate; installs them from Debian if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh

ROUNDS=${1:-3}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-100}
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v openssl >/dev/null || need+=(openssl)
install_packages "${need[@]}"
cargo build --release -q -p sluice-cli
SLUICE=target/release/sluice
HZ=$(getconf CLK_TCK)

scratch
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$tmp/key.pem" -out "$tmp/cert.pem" 2>/dev/null
write_bench_config "$tmp/plain.yaml"
{ cat "$tmp/plain.yaml"; echo "tls: {cert: cert.pem, key: key.pem}"; } >"$tmp/tls.yaml"
start() {
  "$SLUICE" serve --threads 1 --config "$tmp/$1.yaml" --listen 127.0.0.1:0 >"$tmp/$1.out" 2>"$tmp/$1.err" &
  pid=$!
  pids+=("$pid")
  url=$(listening_url "$tmp/$1.out" "$tmp/$1.err")
}
start plain; PLAIN_URL=$url; plain_pid=$pid
start tls; TLS_URL=$url; tls_pid=$pid

cases=(
  "plaintext, admitted|$PLAIN_URL|bench@example.com|$plain_pid"
  "TLS, admitted|$TLS_URL|bench@example.com|$tls_pid"
  "plaintext, denied|$PLAIN_URL|alice@example.com|$plain_pid"
  "TLS, denied|$TLS_URL|alice@example.com|$tls_pid"
)
for c in "${cases[@]}"; do
  IFS='|' read -r _ url account _ <<<"$c"
  wrk -t1 -c"$CONNECTIONS" -d2s -H "X-Account-ID: $account" "$url" >/dev/null
done
echo "wrk -t1 -c$CONNECTIONS -d$DURATION, $ROUNDS rounds, $(nproc) cores, one serving thread"
for round in $(seq "$ROUNDS"); do
  for i in "${!cases[@]}"; do
    IFS='|' read -r name url account pid <<<"${cases[$i]}"
    before=$(ticks "$pid")
    out=$(wrk -t1 -c"$CONNECTIONS" -d"$DURATION" -H "X-Account-ID: $account" "$url")
    after=$(ticks "$pid")
    rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
    total=$(awk '/requests in/ {print $1}' <<<"$out")
    cpu=$(awk -v t="$((after - before))" -v hz="$HZ" -v n="$total" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
    echo "$i $rps $cpu $round" >>"$tmp/results"
    printf '  round %d  %-22s %10s req/s  %6s us CPU/req\n' "$round" "$name" "$rps" "$cpu"
  done
done
echo
printf '| %-22s | %12s | %14s |\n' "case" "median req/s" "us CPU per req"
printf '|%s|%s|%s|\n' "------------------------" "-------------:" "---------------:"
for i in "${!cases[@]}"; do
  IFS='|' read -r name _ _ _ <<<"${cases[$i]}"
  rps=$(awk -v i="$i" '$1 == i {print $2}' "$tmp/results" | median)
  cpu=$(awk -v i="$i" '$1 == i {print $3}' "$tmp/results" | median)
  printf '| %-22s | %12.0f | %14.2f |\n' "$name" "$rps" "$cpu"
done
for pair in "admitted 1 0" "denied 3 2"; do
  read -r what t p <<<"$pair"
  cpu=$(awk -v a="$t" -v b="$p" '$1 == a {x[$4] = $3} $1 == b {y[$4] = $3} END {for (r in x) print x[r] / y[r]}' "$tmp/results" | median)
  echo "$what: CPU per request, TLS / plaintext (median over rounds): $cpu"
done
