#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets/) for SECONDS each with cargo fuzz (libFuzzer),
# which needs a nightly toolchain. New inputs go to fuzz/corpus/TARGET (kept between runs),
# starting from the seeds in fuzz/seeds/TARGET; a crash is saved under fuzz/artifacts/TARGET
# and makes the script fail once every target has run. Add it to
# crates/sluice-invariants/tests/regressions.rs when fixed.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-}
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/fuzz.sh SECONDS (how long each target runs)" >&2
  exit 2
fi
if ! command -v rustup >/dev/null 2>&1 || ! rustup toolchain list | grep -q '^nightly'; then
  echo "scripts/fuzz.sh: cargo fuzz needs a nightly toolchain; install one with" \
    "'rustup toolchain install nightly' (stable builds and tests do not need it)" >&2
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

cargo +nightly fuzz build
failed=()
for target in $(cargo +nightly fuzz list); do
  corpus=fuzz/corpus/$target
  mkdir -p "$corpus"
  dirs=("$corpus")
  [[ -d fuzz/seeds/$target ]] && dirs+=("fuzz/seeds/$target")
  echo "== $target: ${seconds}s"
  if ! cargo +nightly fuzz run "$target" "${dirs[@]}" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1; then
    failed+=("$target")
  fi
done
if ((${#failed[@]})); then
  echo "scripts/fuzz.sh: crashes in: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
echo "scripts/fuzz.sh: no crash in ${seconds}s per target"
