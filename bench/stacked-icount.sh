#!/usr/bin/env bash
# Instructions per decision of the descriptor engine on a rule of two quotas against a rule of
# one (the `stacked` case of `cargo bench -p sluice-service --bench descriptors`), counted by
# valgrind's callgrind: each run is made with FEW and MANY checks, and the difference over
# MANY - FEW leaves out the setup.
#
# Usage: bench/stacked-icount.sh   (FEW=10000, MANY=60000 in the environment). Installs
# valgrind from Debian if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
export LC_ALL=C
FEW=${FEW:-10000}
MANY=${MANY:-60000}
[ "$MANY" -gt "$FEW" ] 2>/dev/null || { echo "stacked-icount: MANY ($MANY) must be a number above FEW ($FEW)" >&2; exit 2; }

command -v valgrind >/dev/null || install_packages valgrind
BIN=$(bench_binary stacked_icount sluice-service)
[ -x "$BIN" ] || { echo "stacked-icount: no stacked_icount executable" >&2; exit 1; }

declare -A per=()
for quotas in one two; do
  few=$(event "$(valgrind_totals callgrind "$BIN" "$quotas" "$FEW")" Ir)
  many=$(event "$(valgrind_totals callgrind "$BIN" "$quotas" "$MANY")" Ir)
  per[$quotas]=$(((many - few) / (MANY - FEW)))
done
printf '%-12s %8s\n' quotas instructions
printf '%-12s %8d\n' one "${per[one]}" two "${per[two]}"
printf 'two / one: %.2f\n' "$(awk -v a="${per[two]}" -v b="${per[one]}" 'BEGIN {print a / b}')"
