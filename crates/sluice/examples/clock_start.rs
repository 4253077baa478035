//! What the first reading of a clock costs in a fresh process: sluice's `MonotonicClock`
//! (readings from `Instant` while the time-stamp counter's rate is measured in the background
//! of the first 50 ms) against quanta's clock (governor's), which calibrates before its first
//! reading. Per-reading costs, once settled, are in `cargo bench -p sluice --bench direct --
//! clock`.
//!
//! `cargo run --release -p sluice --example clock_start`

use std::time::Instant;

use sluice::{Clock, MonotonicClock};

fn main() {
    let start = Instant::now();
    let first = MonotonicClock.now();
    let sluice_first = start.elapsed();

    let start = Instant::now();
    let clock = quanta::Clock::new();
    let first_quanta = clock.now();
    let quanta_first = start.elapsed();

    println!("first reading, sluice MonotonicClock: {sluice_first:?} (reads {first} ns)");
    println!("first reading, quanta::Clock::new + now: {quanta_first:?} ({first_quanta:?})");
}
