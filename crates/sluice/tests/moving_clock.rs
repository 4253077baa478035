//! Many threads on one limit while another thread moves the clock: windows roll over,
//! refills race with checks at different times, epochs move. However they interleave, a
//! limit admits no more over the run than its definition allows in that time from a full start.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use sluice::{
    Algorithm, Clock, FixedWindow, KeyedLimiter, LeakyBucket, ManualClock, Quota, RateLimiter,
    SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};

const CHECKERS: usize = 4;
/// 1000/s with a burst of 100: one unit a millisecond, windows of 100 ms.
const QUOTA: &str = "1000/s burst 100";
const CAPACITY: u64 = 100;
const NANOS_PER_UNIT: u64 = 1_000_000;
const WINDOW_NANOS: u64 = 100_000_000;
/// The clock moves 1.5 s in steps of 37 µs (not a divisor of a unit or a window).
const STEP_NANOS: u64 = 37_000;
const STEPS: u64 = 40_541;

/// The most a bucket (token or leaky meter) admits in `elapsed` ns from full.
fn bucket_bound(elapsed: u64) -> u64 {
    CAPACITY + elapsed / NANOS_PER_UNIT
}

/// The most a window algorithm admits in `elapsed` ns: a capacity in each window the run
/// touches.
fn window_bound(elapsed: u64) -> u64 {
    CAPACITY * (elapsed / WINDOW_NANOS + 1)
}

/// Runs `check` on the checker threads while the clock moves; returns the admissions and the
/// time the run covered.
fn run_moving(clock: &ManualClock, check: impl Fn(usize) -> bool + Send + Sync) -> (u64, u64) {
    let start = clock.now();
    let admitted = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    thread::scope(|scope| {
        for t in 0..CHECKERS {
            let (admitted, done, check) = (&admitted, &done, &check);
            scope.spawn(move || {
                while !done.load(Ordering::Acquire) {
                    if check(t) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        scope.spawn(|| {
            for step in 0..STEPS {
                clock.advance_nanos(STEP_NANOS);
                if step % 64 == 0 {
                    thread::yield_now();
                }
            }
            done.store(true, Ordering::Release);
        });
    });
    (admitted.into_inner(), clock.now() - start)
}

fn direct<A: Algorithm>(algorithm: A, bound: fn(u64) -> u64) {
    let clock = ManualClock::new(42);
    let limiter =
        Arc::new(RateLimiter::with_clock(algorithm, QUOTA.parse::<Quota>().unwrap(), clock.clone()).unwrap());
    let (admitted, elapsed) = run_moving(&clock, |_| limiter.check().is_allowed());
    assert!(
        admitted <= bound(elapsed),
        "{} admitted {admitted} in {elapsed} ns, at most {} allowed",
        limiter.algorithm().name(),
        bound(elapsed)
    );
}

#[test]
fn token_bucket_admits_at_most_burst_plus_rate_while_time_moves() {
    direct(TokenBucket, bucket_bound);
}

#[test]
fn leaky_bucket_meter_admits_at_most_burst_plus_rate_while_time_moves() {
    direct(LeakyBucket::meter(), bucket_bound);
}

#[test]
fn fixed_window_admits_at_most_a_capacity_per_window_while_time_moves() {
    direct(FixedWindow, window_bound);
}

#[test]
fn sliding_log_admits_at_most_a_capacity_per_window_while_time_moves() {
    direct(SlidingWindowLog, window_bound);
}

#[test]
fn sliding_counter_admits_at_most_a_capacity_per_window_while_time_moves() {
    direct(SlidingWindowCounter, window_bound);
}

#[test]
fn keyed_limits_admit_at_most_burst_plus_rate_per_key_while_time_moves() {
    const KEYS: usize = 3;
    let clock = ManualClock::new(42);
    let limiter = KeyedLimiter::<usize, _>::builder(TokenBucket, QUOTA.parse().unwrap())
        .unknown_key_quota(QUOTA.parse().unwrap())
        .shards(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    let per_key: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(0)).collect();
    let round = AtomicU64::new(0);
    let (_, elapsed) = run_moving(&clock, |_| {
        // Every thread cycles over every key, so each key has racing checkers.
        let key = (round.fetch_add(1, Ordering::Relaxed) % KEYS as u64) as usize;
        let allowed = limiter.check(&key).is_allowed();
        if allowed {
            per_key[key].fetch_add(1, Ordering::Relaxed);
        }
        allowed
    });
    for (key, admitted) in per_key.iter().enumerate() {
        let admitted = admitted.load(Ordering::Relaxed);
        assert!(
            admitted <= bucket_bound(elapsed),
            "key {key} admitted {admitted} in {elapsed} ns"
        );
    }
}
