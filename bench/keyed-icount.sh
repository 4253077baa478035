#!/usr/bin/env bash
# Instructions per check of the keyed limiter against governor, counted by valgrind's
# callgrind on each side's manual clock: unlike ns per check on a shared VM, the count does
# not move between runs. Each side of each case runs twice, with FEW and MANY checks after the
# same setup; the difference over MANY - FEW checks leaves out the setup (filling the store).
#
# Usage: bench/keyed-icount.sh [CASE...]   (default: hot_1k random_1m new_key; FEW=100000,
# MANY=600000 in the environment). Installs valgrind from Debian if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
FEW=${FEW:-100000}
MANY=${MANY:-600000}
CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(hot_1k random_1m new_key)

command -v valgrind >/dev/null || install_packages valgrind
BIN=$(cargo bench -p sluice --bench keyed_icount --no-run 2>&1 |
  sed -n 's/.*Executable .*(\(.*keyed_icount-[0-9a-f]*\)).*/\1/p' | tail -1)
[ -x "$BIN" ] || { echo "keyed-icount: could not build the keyed_icount bench" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Instructions of one run: side case checks.
count() {
  valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$BIN" "$1" "$2" "$3" >/dev/null 2>"$tmp/err" ||
    { echo "keyed-icount: $1 $2 failed:" >&2; cat "$tmp/err" >&2; exit 1; }
  awk '/^(summary|totals):/ {print $2; exit}' "$tmp/out"
}
printf '%-10s %10s %10s %8s\n' case sluice governor ratio
for case in "${CASES[@]}"; do
  for side in sluice governor; do
    few=$(count "$side" "$case" "$FEW")
    many=$(count "$side" "$case" "$MANY")
    eval "per_$side=$(( (many - few) / (MANY - FEW) ))"
  done
  printf '%-10s %10d %10d %8.2f\n' "$case" "$per_sluice" "$per_governor" \
    "$(awk -v s="$per_sluice" -v g="$per_governor" 'BEGIN {print s / g}')"
done
