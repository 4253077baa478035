//! Many threads on one limit while another thread moves the clock: windows roll over,
//! refills race with checks at different times, epochs move. However they interleave, a
//! limit admits no more over the run than its definition allows in that time from a full start,
//! and no less than it must when every reading of the clock is asked until it denies.
//!
//! The checkers start before the clock moves (a barrier), and every 27 steps (999 µs, less than
//! a unit) and at the last, the clock waits until a check begun at that reading has been denied
//! (on every key, for the keyed limiter): by then every unit due at that reading has been
//! taken. So the checks run while the clock moves, and the demand is greedy, which makes the
//! least a correct limit admits a number the test can state: for the buckets and the fixed
//! window it is the most it may admit, so the two bounds pin the count.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
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
/// The clock waits for a denial every this many steps (999 µs), and at the last.
const DRAIN_EVERY: u64 = 27;
/// The longest the clock moves between two readings asked until they deny.
const DRAIN_NANOS: u64 = DRAIN_EVERY * STEP_NANOS;

/// The admissions a run allows at most and needs at least, given the time it covered.
struct Bounds {
    most: fn(u64) -> u64,
    least: fn(u64) -> u64,
}

/// A bucket (token or leaky meter) admits at most its burst and a unit per unit of time from
/// full. Asked until it denies at least once a unit, and at the end, it is never full after
/// the start, so no unit goes unused: it admits exactly that.
const BUCKET: Bounds = Bounds {
    most: |elapsed| CAPACITY + elapsed / NANOS_PER_UNIT,
    least: |elapsed| CAPACITY + elapsed / NANOS_PER_UNIT,
};

/// A capacity in each window the run touches (windows start at the limit's epoch, the run's
/// start): at most for every window algorithm, and exactly for the fixed window asked until it
/// denies in each (the last holds only the last 17 µs, and the last reading is asked).
fn windows_touched(elapsed: u64) -> u64 {
    CAPACITY * (elapsed / WINDOW_NANOS + 1)
}

const FIXED_WINDOW: Bounds = Bounds {
    most: windows_touched,
    least: windows_touched,
};

/// The log takes a capacity at the start. A unit's entry leaves the window a window after it
/// was admitted, and the reading asked until it denies next after that takes the unit again:
/// each of the capacity's units is taken at least once every window and 999 µs, so 15 times in
/// the 1.500017 s run, where a window is 100 ms.
const SLIDING_LOG: Bounds = Bounds {
    most: windows_touched,
    least: |elapsed| CAPACITY * (elapsed / (WINDOW_NANOS + DRAIN_NANOS) + 1),
};

/// The counter takes a capacity in the first window. At the last reading of every later window
/// asked until it denies, less than 999 µs before its end, the window's count and what still
/// weighs of the previous one's fill the capacity; that weight is the previous count (at most
/// a capacity) times the time left over the window, rounded up: what a window boundary can
/// cost, 1 here. So each window the run covers whole holds at least a capacity less that.
const SLIDING_COUNTER: Bounds = Bounds {
    most: windows_touched,
    least: |elapsed| {
        let boundary_cost = (CAPACITY * DRAIN_NANOS).div_ceil(WINDOW_NANOS);
        CAPACITY + (elapsed / WINDOW_NANOS - 1) * (CAPACITY - boundary_cost)
    },
};

/// What a run saw.
struct Run {
    /// Admissions per key.
    admitted: Vec<u64>,
    /// Checks that ended after the clock first moved and before it stopped.
    checks_while_moving: u64,
    /// The time the run covered.
    elapsed: u64,
}

/// Runs `check` on the checker threads while the clock moves. `check` answers the key it
/// checked (below `keys`) and whether it was admitted.
fn run_moving(clock: &ManualClock, keys: usize, check: impl Fn(usize) -> (usize, bool) + Send + Sync) -> Run {
    let start = clock.now();
    let admitted: Vec<AtomicU64> = (0..keys).map(|_| AtomicU64::new(0)).collect();
    // Per key, one more than the last step at which a check begun at that step was denied.
    let drained: Vec<AtomicU64> = (0..keys).map(|_| AtomicU64::new(0)).collect();
    let step = AtomicU64::new(0);
    let checks = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let barrier = Barrier::new(CHECKERS + 1);
    // A limit that never denies would hold the clock forever; past this many checks at one
    // step without a denial on every key (a correct limit admits at most a capacity per key
    // at one reading), the clock moves on anyway and the upper bound will tell.
    let give_up = 4 * CHECKERS as u64 + keys as u64 * (2 * CAPACITY + 1);
    let mut checks_while_moving = 0;
    thread::scope(|scope| {
        for t in 0..CHECKERS {
            let (admitted, drained, step, checks, done, barrier, check) =
                (&admitted, &drained, &step, &checks, &done, &barrier, &check);
            scope.spawn(move || {
                barrier.wait();
                while !done.load(Ordering::Acquire) {
                    let at = step.load(Ordering::Acquire);
                    // Once every key has denied at this reading, all but the first checker
                    // leave the cores to the clock; the first keeps checking across its moves.
                    if t > 0 && drained.iter().all(|d| d.load(Ordering::Acquire) > at) {
                        thread::yield_now();
                        continue;
                    }
                    let (key, allowed) = check(t);
                    if allowed {
                        admitted[key].fetch_add(1, Ordering::Relaxed);
                    } else {
                        drained[key].fetch_max(at + 1, Ordering::AcqRel);
                    }
                    checks.fetch_add(1, Ordering::AcqRel);
                }
            });
        }
        let wait_drained = |at: u64| {
            let before = checks.load(Ordering::Acquire);
            while drained.iter().any(|d| d.load(Ordering::Acquire) <= at)
                && checks.load(Ordering::Acquire) - before < give_up
            {
                thread::yield_now();
            }
        };
        barrier.wait();
        wait_drained(0);
        let moving_from = checks.load(Ordering::Acquire);
        for s in 1..=STEPS {
            clock.advance_nanos(STEP_NANOS);
            step.store(s, Ordering::Release);
            if s % DRAIN_EVERY == 0 || s == STEPS {
                wait_drained(s);
            }
        }
        checks_while_moving = checks.load(Ordering::Acquire) - moving_from;
        done.store(true, Ordering::Release);
    });
    Run {
        admitted: admitted.into_iter().map(AtomicU64::into_inner).collect(),
        checks_while_moving,
        elapsed: clock.now() - start,
    }
}

/// Every key's admissions within `bounds`, and checks ended while the clock moved.
fn assert_within(name: &str, run: &Run, bounds: &Bounds) {
    assert_eq!(run.elapsed, STEPS * STEP_NANOS);
    let drains = STEPS.div_ceil(DRAIN_EVERY);
    assert!(
        run.checks_while_moving >= drains,
        "{name}: {} checks ended while the clock moved; it waited for a denial {drains} times",
        run.checks_while_moving
    );
    let (most, least) = ((bounds.most)(run.elapsed), (bounds.least)(run.elapsed));
    for (key, &admitted) in run.admitted.iter().enumerate() {
        assert!(
            (least..=most).contains(&admitted),
            "{name}: key {key} admitted {admitted} in {} ns, between {least} and {most} allowed",
            run.elapsed
        );
    }
}

fn direct<A: Algorithm>(algorithm: A, bounds: Bounds) {
    let clock = ManualClock::new(42);
    let limiter =
        Arc::new(RateLimiter::with_clock(algorithm, QUOTA.parse::<Quota>().unwrap(), clock.clone()).unwrap());
    let run = run_moving(&clock, 1, |_| (0, limiter.check().is_allowed()));
    assert_within(limiter.algorithm().name(), &run, &bounds);
}

#[test]
fn token_bucket_admits_burst_plus_rate_while_time_moves() {
    direct(TokenBucket, BUCKET);
}

#[test]
fn leaky_bucket_meter_admits_burst_plus_rate_while_time_moves() {
    direct(LeakyBucket::meter(), BUCKET);
}

#[test]
fn fixed_window_admits_a_capacity_per_window_while_time_moves() {
    direct(FixedWindow, FIXED_WINDOW);
}

#[test]
fn sliding_log_admits_a_capacity_per_window_while_time_moves() {
    direct(SlidingWindowLog, SLIDING_LOG);
}

#[test]
fn sliding_counter_admits_about_a_capacity_per_window_while_time_moves() {
    direct(SlidingWindowCounter, SLIDING_COUNTER);
}

#[test]
fn keyed_limits_admit_burst_plus_rate_per_key_while_time_moves() {
    const KEYS: usize = 3;
    let clock = ManualClock::new(42);
    let limiter = KeyedLimiter::<usize, _>::builder(TokenBucket, QUOTA.parse().unwrap())
        .unknown_key_quota(QUOTA.parse().unwrap())
        .shards(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    let round = AtomicU64::new(0);
    let run = run_moving(&clock, KEYS, |_| {
        // Every thread cycles over every key, so each key has racing checkers.
        let key = (round.fetch_add(1, Ordering::Relaxed) % KEYS as u64) as usize;
        (key, limiter.check(&key).is_allowed())
    });
    assert_within("keyed token bucket", &run, &BUCKET);
}
