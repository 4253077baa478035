#!/usr/bin/env bash
# RLQS: three simulated Envoys sharing a 1000/s limit (offering 150, 300 and 1050 requests a
# second), then the first leaving and the second doubling; each 10 s window's admitted
# total and each Envoy's part, on a simulated clock driving the server's buckets
# (`crates/sluice-service/tests/rlqs_simulation.rs`, `virtual_clock`), then the short run in
# real time over a socket (`over_a_socket`). The run fails if a window is off the limit by
# more than 2% or an Envoy gets less than its fair share (or its demand) less 5%.
#
# Usage: bench/rlqs.sh   (PHASE_SECONDS=600 in the environment: each phase's length).
set -euo pipefail
cd "$(dirname "$0")/.."
PHASE_SECONDS=${PHASE_SECONDS:-600}
[ "$PHASE_SECONDS" -ge 20 ] 2>/dev/null || { echo "rlqs: PHASE_SECONDS ($PHASE_SECONDS) must be a number of at least 20" >&2; exit 2; }
RLQS_SIM_PHASE_SECONDS=$PHASE_SECONDS cargo test --release -p sluice-service --test rlqs_simulation \
  -- --nocapture --test-threads 1
