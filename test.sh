#!/usr/bin/env bash
# The whole test suite: unit, property, stress and doc tests.
set -euo pipefail
cd "$(dirname "$0")"
scripts/ensure-redis.sh
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --release --no-fail-fast
else
  cargo test --workspace --release --no-fail-fast --lib --bins --tests
fi
cargo test --workspace --release --doc
