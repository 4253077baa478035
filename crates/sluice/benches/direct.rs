//! The cost of one check on a direct (un-keyed) limiter, for every algorithm, admitted and
//! denied, with governor's direct limiter (GCRA) as the reference for the GCRA algorithms.
//!
//! Run with `cargo bench -p sluice --bench direct` (add a filter such as `token_bucket` to run
//! one group). Benchmark ids are `group/condition/implementation`.
//!
//! Conditions, identical for sluice and governor:
//! - `*/allowed`: a `10/s` limit (burst 10) on a manual clock that is advanced by exactly one
//!   emission interval (100 ms) before every check, so every check is admitted and writes its
//!   state. The advance is inside the measurement on both sides (`clock/advance/*` measures it
//!   alone). The sliding window counter is advanced by two intervals: at exactly the limit its
//!   estimate denies some checks.
//! - `*/denied`: the same limit, exhausted, with the clock frozen: every check is denied.
//! - `token_bucket/admitted`: the check alone, without a clock advance: a `10/s` limit with a
//!   burst of [`HUGE_BURST`] on a frozen clock, so every check is admitted and writes its
//!   state (no benchmark run comes near exhausting the burst).
//! - `leaky_bucket_shaper/delayed`: the shaper's queue is full and the clock advances by one
//!   interval per check, so every check is admitted with the maximum delay.
//! - `clock/*`: the real clocks. `check_allowed` is an admitted check of a `1e9/s` limit
//!   (never exhausted) on sluice's `MonotonicClock` (the TSC where the kernel trusts it, else
//!   std `Instant`) and on governor's default clock (quanta); `now` is one reading of each
//!   clock alone, so the clock's share of a check can be told apart, and of std's `Instant`
//!   (as nanoseconds since a start), what `MonotonicClock` reads where the TSC is not used.
//!
//! Before measuring, every case is run 1000 times and asserted to decide as its name says.

mod direct_cases;

use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, black_box, criterion_group, criterion_main};
use direct_cases::{
    INTERVAL, RATE, governor_admitted, governor_exhausted, governor_quota, governor_stepped, sluice_admitted,
    sluice_exhausted, sluice_quota, sluice_stepped,
};
use governor::clock::{Clock as _, DefaultClock, FakeRelativeClock};
use sluice::{
    Algorithm, Clock as _, ConcurrencyLimiter, FixedWindow, LeakyBucket, ManualClock, MonotonicClock,
    RateLimiter, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};

/// A rate no benchmark loop can exhaust on a real clock: one unit per nanosecond.
const FAST_RATE: u32 = 1_000_000_000;

type Group<'a> = BenchmarkGroup<'a, WallTime>;

/// Benchmarks `check` as `group/condition/who`, after asserting that it returns `expected`.
fn bench_check(
    group: &mut Group,
    condition: &str,
    who: &str,
    expected: bool,
    mut check: impl FnMut() -> bool,
) {
    for _ in 0..1000 {
        assert_eq!(check(), expected, "{condition}/{who} decides otherwise");
    }
    group.bench_function(BenchmarkId::new(condition, who), |b| b.iter(&mut check));
}

/// `allowed` (the clock advanced by `step` per check) and `denied` for a sluice algorithm.
fn sluice_cases<A: Algorithm + Copy>(group: &mut Group, algorithm: A, step: Duration) {
    bench_check(group, "allowed", "sluice", true, sluice_stepped(algorithm, step));
    bench_check(group, "denied", "sluice", false, sluice_exhausted(algorithm));
}

/// The same cases for governor's direct limiter.
fn governor_cases(group: &mut Group) {
    bench_check(group, "allowed", "governor", true, governor_stepped(INTERVAL));
    bench_check(group, "denied", "governor", false, governor_exhausted());
}

fn token_bucket(c: &mut Criterion) {
    let mut group = c.benchmark_group("token_bucket");
    sluice_cases(&mut group, TokenBucket, INTERVAL);
    governor_cases(&mut group);

    bench_check(&mut group, "admitted", "sluice", true, sluice_admitted());
    bench_check(&mut group, "admitted", "governor", true, governor_admitted());
    group.finish();
}

fn leaky_bucket_meter(c: &mut Criterion) {
    let mut group = c.benchmark_group("leaky_bucket_meter");
    sluice_cases(&mut group, LeakyBucket::meter(), INTERVAL);
    // The meter is GCRA like governor, so governor is a natural reference here too.
    governor_cases(&mut group);
    group.finish();
}

fn leaky_bucket_shaper(c: &mut Criterion) {
    let mut group = c.benchmark_group("leaky_bucket_shaper");
    let shaper = LeakyBucket::shaper(Duration::from_secs(1));
    sluice_cases(&mut group, shaper, INTERVAL);

    // Queue full: each check waits for the one before it to leave, with the maximum delay.
    let clock = ManualClock::new(0);
    let limiter = RateLimiter::with_clock(shaper, sluice_quota(RATE), clock.clone()).expect("valid quota");
    while limiter.check().is_allowed() {}
    bench_check(&mut group, "delayed", "sluice", true, move || {
        clock.advance(black_box(INTERVAL));
        black_box(black_box(&limiter).check()).delay_nanos() > 0
    });
    group.finish();
}

fn fixed_window(c: &mut Criterion) {
    let mut group = c.benchmark_group("fixed_window");
    sluice_cases(&mut group, FixedWindow, INTERVAL);
    group.finish();
}

fn sliding_window_log(c: &mut Criterion) {
    let mut group = c.benchmark_group("sliding_window_log");
    sluice_cases(&mut group, SlidingWindowLog, INTERVAL);
    group.finish();
}

fn sliding_window_counter(c: &mut Criterion) {
    let mut group = c.benchmark_group("sliding_window_counter");
    sluice_cases(&mut group, SlidingWindowCounter, INTERVAL * 2);
    group.finish();
}

fn concurrency(c: &mut Criterion) {
    let mut group = c.benchmark_group("concurrency");
    let limiter = ConcurrencyLimiter::new(10);
    // try_acquire and the drop of its permit.
    bench_check(&mut group, "allowed", "sluice", true, || {
        black_box(black_box(&limiter).try_acquire(1)).is_ok()
    });
    let held = limiter.try_acquire(10).expect("10 permits are free");
    bench_check(&mut group, "denied", "sluice", false, || {
        black_box(black_box(&limiter).try_acquire(1)).is_ok()
    });
    drop(held);
    group.finish();
}

fn clock(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock");

    let limiter = RateLimiter::new(TokenBucket, sluice_quota(FAST_RATE)).expect("valid quota");
    bench_check(&mut group, "check_allowed", "sluice_monotonic", true, || {
        black_box(black_box(&limiter).check()).is_allowed()
    });
    let reference = governor::RateLimiter::direct(governor_quota(FAST_RATE));
    bench_check(&mut group, "check_allowed", "governor_quanta", true, || {
        black_box(black_box(&reference).check()).is_ok()
    });

    group.bench_function(BenchmarkId::new("now", "sluice_monotonic"), |b| {
        b.iter(|| black_box(&MonotonicClock).now());
    });
    let quanta = DefaultClock::default();
    group.bench_function(BenchmarkId::new("now", "governor_quanta"), |b| {
        b.iter(|| black_box(&quanta).now());
    });
    let start = Instant::now();
    group.bench_function(BenchmarkId::new("now", "std_instant"), |b| {
        b.iter(|| black_box(start).elapsed().as_nanos() as u64);
    });

    // The manual clocks' advance, included in every `*/allowed` case above.
    let manual = ManualClock::new(0);
    group.bench_function(BenchmarkId::new("advance", "sluice_manual"), |b| {
        b.iter(|| black_box(&manual).advance(black_box(INTERVAL)));
    });
    let fake = FakeRelativeClock::default();
    group.bench_function(BenchmarkId::new("advance", "governor_fake"), |b| {
        b.iter(|| black_box(&fake).advance(black_box(INTERVAL)));
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = token_bucket, leaky_bucket_meter, leaky_bucket_shaper, fixed_window,
        sliding_window_log, sliding_window_counter, concurrency, clock
}
criterion_main!(benches);
