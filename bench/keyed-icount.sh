#!/usr/bin/env bash
# Instructions per check of the keyed limiter against governor (on its default hasher,
# SipHash, and on sluice's, foldhash), counted by valgrind's callgrind on each side's manual
# clock. Unlike ns per check on a shared VM, the count moves
# by a few instructions at most between runs (the hashers' seeds are random per process). Each
# side of each case runs twice, with FEW and MANY checks after the same setup; the difference
# over MANY - FEW checks leaves out the setup (filling the store).
#
# Usage: bench/keyed-icount.sh [CASE...]   (default: hot_1k random_1m new_key; FEW=100000,
# MANY=600000 in the environment: multiples of 100 000, so governor's `new_key` pays its
# sweep, every 100 000 new keys, in proportion). Installs valgrind from Debian if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
export LC_ALL=C
FEW=${FEW:-100000}
MANY=${MANY:-600000}
CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(hot_1k random_1m new_key)
[ "$MANY" -gt "$FEW" ] 2>/dev/null || { echo "keyed-icount: MANY ($MANY) must be a number above FEW ($FEW)" >&2; exit 2; }

command -v valgrind >/dev/null || install_packages valgrind
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! cargo bench -p sluice --bench keyed_icount --no-run --message-format=json >"$tmp/build" 2>"$tmp/build.err"; then
  echo "keyed-icount: building the keyed_icount bench failed:" >&2
  cat "$tmp/build.err" >&2
  exit 1
fi
BIN=$(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "keyed_icount" and m.get("executable"):
        print(m["executable"])
' "$tmp/build" | tail -1)
[ -x "$BIN" ] || { echo "keyed-icount: no keyed_icount executable in cargo's output" >&2; exit 1; }

# Instructions of one run: side case checks.
count() {
  valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$BIN" "$1" "$2" "$3" >/dev/null 2>"$tmp/err" ||
    { echo "keyed-icount: $1 $2 failed:" >&2; cat "$tmp/err" >&2; exit 1; }
  local total
  total=$(awk '/^(summary|totals):/ {print $2; exit}' "$tmp/out")
  [ -n "$total" ] || { echo "keyed-icount: no instruction total in callgrind's output" >&2; exit 1; }
  echo "$total"
}
ratio() { awk -v s="$1" -v g="$2" 'BEGIN {printf "%.2f", s / g}'; }
printf '%-10s %10s %10s %8s %18s %8s\n' case sluice governor ratio governor_foldhash ratio
for case in "${CASES[@]}"; do
  for side in sluice governor governor_foldhash; do
    few=$(count "$side" "$case" "$FEW")
    many=$(count "$side" "$case" "$MANY")
    eval "per_$side=$(((many - few) / (MANY - FEW)))"
  done
  printf '%-10s %10d %10d %8s %18d %8s\n' "$case" "$per_sluice" "$per_governor" \
    "$(ratio "$per_sluice" "$per_governor")" "$per_governor_foldhash" \
    "$(ratio "$per_sluice" "$per_governor_foldhash")"
done
