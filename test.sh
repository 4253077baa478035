#!/usr/bin/env bash
# The whole test suite: unit, property, stress and doc tests, the core in debug too, and the
# loom model checks.
set -euo pipefail
cd "$(dirname "$0")"
scripts/ensure-redis.sh
scripts/ensure-postgres.sh
scripts/ensure-chromium.sh
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --release --no-fail-fast
else
  cargo test --workspace --release --no-fail-fast --lib --bins --tests
fi
cargo test --workspace --release --doc
# The benches' own setup assertions, each bench run once (criterion's test mode), and the core
# without its default features (no tokio).
cargo test --workspace --release --benches
cargo build -p sluice --release --no-default-features
# The core once more in debug, where its debug assertions and overflow checks run.
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run -p sluice --no-fail-fast
else
  cargo test -p sluice --no-fail-fast --lib --tests
fi
# The lock-free protocols under the loom model checker (the `loom_tests` modules): a build of
# its own (other cfg, other target dir), so the one above stays cached. The name filter also
# keeps out the other unit tests, whose primitives are loom's in this build. The tests run in
# about a second; a cold build of the dev-dependencies takes a few minutes.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS=5 \
  cargo test -p sluice --release --lib loom
