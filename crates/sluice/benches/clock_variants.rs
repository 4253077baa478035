//! Why a real clock costs the `random_1m` case of `keyed_paired` more than a clock read should:
//! the same store and keys on clocks that differ in one thing each, taking turns in one
//! process (as `keyed_paired` does), so that what the real clock does differently shows.
//!
//! - `manual`: the benches' frozen clock (a load of a shared word).
//! - `ticking`: a clock that moves 300 ns per reading (a load and a store): time passes as on
//!   the real clock, read for the price of the manual one.
//! - `counter_unused`: the manual clock plus a read of the time-stamp counter whose value is
//!   thrown away: the instruction, without the time.
//! - `counter`: the time-stamp counter itself as the time (no scaling).
//! - `monotonic`: sluice's default clock (the counter, scaled).
//! - `manual_fenced`: the manual clock behind an `lfence`, which lets no later instruction
//!   start before every earlier one has finished.
//!
//! On the machine of docs/BENCHMARKS.md the real clocks (`counter`, `monotonic`) and the
//! fenced manual one cost the same, and the others the manual clock's price: a counter read
//! here holds back the next check's first cache miss until the current check's last one is
//! done, so two checks no longer overlap. What a check costs on a real clock is then the sum
//! of its own dependent misses, which is what the table's layout decides.
//!
//! Run with `cargo bench -p sluice --bench clock_variants` (`SLUICE_VARIANT_ROUNDS` sets the
//! rounds, default 11). Prints each variant's median ns per check.

mod common;
mod paired;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use common::{Case, Side, SluiceCase, Step};
use sluice::{Clock, ManualClock, MonotonicClock};

const DEFAULT_ROUNDS: usize = 11;
const CHECKS_PER_ROUND: u32 = 250_000;

/// Moves 300 ns at each reading.
#[derive(Clone)]
struct Ticking(Arc<AtomicU64>);

impl Clock for Ticking {
    fn now(&self) -> u64 {
        let t = self.0.load(Ordering::Relaxed) + 300;
        self.0.store(t, Ordering::Relaxed);
        t
    }
}

impl Step for Ticking {}

/// Reads the counter, then answers as the manual clock.
#[derive(Clone)]
struct CounterUnused(ManualClock);

impl Clock for CounterUnused {
    fn now(&self) -> u64 {
        std::hint::black_box(counter());
        self.0.now()
    }
}

impl Step for CounterUnused {}

/// The counter's ticks as the time.
#[derive(Clone)]
struct Counter;

impl Clock for Counter {
    fn now(&self) -> u64 {
        counter()
    }
}

impl Step for Counter {}

/// The manual clock behind a fence.
#[derive(Clone)]
struct Fenced(ManualClock);

impl Clock for Fenced {
    fn now(&self) -> u64 {
        fence();
        self.0.now()
    }
}

impl Step for Fenced {}

#[cfg(target_arch = "x86_64")]
fn counter() -> u64 {
    // SAFETY: RDTSC exists on every x86_64 processor and has no side effects.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn counter() -> u64 {
    MonotonicClock.now()
}

#[cfg(target_arch = "x86_64")]
fn fence() {
    // SAFETY: LFENCE exists on every x86_64 processor (SSE2) and only orders instructions.
    unsafe { std::arch::x86_64::_mm_lfence() }
}

#[cfg(not(target_arch = "x86_64"))]
fn fence() {
    std::sync::atomic::fence(Ordering::SeqCst);
}

fn main() {
    let rounds = paired::rounds("SLUICE_VARIANT_ROUNDS", DEFAULT_ROUNDS);
    let case = Case::Random1m;
    let mut sides: Vec<(&str, Box<dyn Side>)> = vec![
        ("manual", Box::new(SluiceCase::new(case, ManualClock::new(0)))),
        (
            "ticking",
            Box::new(SluiceCase::new(case, Ticking(Arc::default()))),
        ),
        (
            "counter_unused",
            Box::new(SluiceCase::new(case, CounterUnused(ManualClock::new(0)))),
        ),
        ("counter", Box::new(SluiceCase::new(case, Counter))),
        ("monotonic", Box::new(SluiceCase::new(case, MonotonicClock))),
        (
            "manual_fenced",
            Box::new(SluiceCase::new(case, Fenced(ManualClock::new(0)))),
        ),
    ];
    let mut times = vec![Vec::with_capacity(rounds); sides.len()];
    for round in 0..rounds {
        // Rotate which side goes first, so none always follows the same one.
        for i in 0..sides.len() {
            let side = (round + i) % sides.len();
            times[side].push(time(|| sides[side].1.check()));
        }
    }
    println!("random_1m, {rounds} rounds: median ns per check");
    for ((name, _), times) in sides.iter().zip(times) {
        println!("{name:<15} {:>7.1}", paired::quartiles(times).0);
    }
}

/// Nanoseconds per check over one round, each check asserted to admit.
fn time(mut check: impl FnMut() -> bool) -> f64 {
    let start = Instant::now();
    for _ in 0..CHECKS_PER_ROUND {
        assert!(check(), "every check admits");
    }
    start.elapsed().as_nanos() as f64 / f64::from(CHECKS_PER_ROUND)
}
