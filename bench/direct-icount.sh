#!/usr/bin/env bash
# Instructions per check of the direct token bucket against governor's direct limiter,
# counted by valgrind's callgrind on each side's manual clock (cases as in the `direct` bench:
# `denied`, `admitted` without a clock step, `allowed` with one). Each run is made twice, with
# FEW and MANY checks; the difference over MANY - FEW checks leaves out the setup. The count
# includes the driver's loop and its boxed call, the same on both sides.
#
# Usage: bench/direct-icount.sh [CASE...]   (default: denied admitted allowed; FEW=100000,
# MANY=600000 in the environment). Installs valgrind from Debian if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
export LC_ALL=C
FEW=${FEW:-100000}
MANY=${MANY:-600000}
CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(denied admitted allowed)
[ "$MANY" -gt "$FEW" ] 2>/dev/null || { echo "direct-icount: MANY ($MANY) must be a number above FEW ($FEW)" >&2; exit 2; }

command -v valgrind >/dev/null || install_packages valgrind
BIN=$(bench_binary direct_icount)
[ -x "$BIN" ] || { echo "direct-icount: no direct_icount executable" >&2; exit 1; }

printf '%-10s %8s %9s %7s\n' case sluice governor ratio
for case in "${CASES[@]}"; do
  declare -A per=()
  for side in sluice governor; do
    few=$(event "$(valgrind_totals callgrind "$BIN" "$side" "$case" "$FEW")" Ir)
    many=$(event "$(valgrind_totals callgrind "$BIN" "$side" "$case" "$MANY")" Ir)
    per[$side]=$(((many - few) / (MANY - FEW)))
  done
  printf '%-10s %8d %9d %7.2f\n' "$case" "${per[sluice]}" "${per[governor]}" \
    "$(awk -v s="${per[sluice]}" -v g="${per[governor]}" 'BEGIN {print s / g}')"
done
