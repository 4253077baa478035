#!/usr/bin/env bash
# Instructions per check of the keyed limiter against governor (on its default hasher,
# SipHash, and on sluice's, foldhash), counted by valgrind's callgrind on each side's manual
# clock. Unlike ns per check on a shared VM, the count moves by a few instructions at most
# between runs (the hashers' seeds are random per process). Each side of each case runs twice,
# with FEW and MANY checks after the same setup; the difference over MANY - FEW checks leaves
# out the setup (filling the store).
#
# With CACHE_SIM=1, cachegrind simulates the caches instead (L1 as the host's, a last level of
# LL_CACHE, default 2 MiB 16-way: "size,ways,line") and the table gives, per check, L1 data
# read and write misses and last-level read and write misses: where each side goes to memory.
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
BIN=$(bench_binary keyed_icount)
[ -x "$BIN" ] || { echo "keyed-icount: no keyed_icount executable" >&2; exit 1; }
SIDES=(sluice governor governor_foldhash)

# Per check, the difference of an event between MANY and FEW checks: side case event...
per_check() {
  local side=$1 case=$2 few many e
  shift 2
  few=$(valgrind_totals "$TOOL" "$BIN" "$side" "$case" "$FEW")
  many=$(valgrind_totals "$TOOL" "$BIN" "$side" "$case" "$MANY")
  for e in "$@"; do
    awk -v a="$(event "$few" "$e")" -v b="$(event "$many" "$e")" -v n="$((MANY - FEW))" \
      'BEGIN {printf "%s ", (b - a) / n}'
  done
}
ratio() { awk -v s="$1" -v g="$2" 'BEGIN {printf "%.2f", s / g}'; }

if [ "${CACHE_SIM:-0}" = 1 ]; then
  TOOL=cachegrind
  echo "cachegrind, last level ${LL_CACHE:-2097152,16,64}; misses per check"
  printf '%-10s %-18s %8s %8s %8s %8s\n' case side D1mr D1mw DLmr DLmw
  for case in "${CASES[@]}"; do
    for side in "${SIDES[@]}"; do
      read -r d1r d1w dlr dlw <<<"$(per_check "$side" "$case" D1mr D1mw DLmr DLmw)"
      printf '%-10s %-18s %8.2f %8.2f %8.2f %8.2f\n' "$case" "$side" "$d1r" "$d1w" "$dlr" "$dlw"
    done
  done
  exit 0
fi

TOOL=callgrind
printf '%-10s %10s %10s %8s %18s %8s\n' case sluice governor ratio governor_foldhash ratio
for case in "${CASES[@]}"; do
  declare -A per=()
  for side in "${SIDES[@]}"; do
    per[$side]=$(per_check "$side" "$case" Ir | awk '{printf "%d", $1}')
  done
  printf '%-10s %10d %10d %8s %18d %8s\n' "$case" "${per[sluice]}" "${per[governor]}" \
    "$(ratio "${per[sluice]}" "${per[governor]}")" "${per[governor_foldhash]}" \
    "$(ratio "${per[sluice]}" "${per[governor_foldhash]}")"
done
