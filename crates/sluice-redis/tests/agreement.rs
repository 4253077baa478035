//! The Redis scripts decide exactly as the core algorithms do, for the same sequence of
//! instants, costs and quota changes (property-based, against a real `redis-server`).
//!
//! Redis' clock cannot be set, so these checks pass the instant to the script instead
//! (`check_n_at_micros`, the only difference from a normal check); the core limiter gets the
//! same instants from a `ManualClock`. Instants are whole microseconds, Redis' resolution.
//!
//! A quota change takes effect at a check: the core limiter's `set_quota` at that instant, and
//! on Redis a second limiter built with the new quota on the same store and prefix, checking the
//! same key, as a host that reloaded its configuration would.
//!
//! The `on_redis_time_*` tests take the production path instead: Redis' own clock (`TIME`),
//! windows where they fall (not aligned with the core's), checks paced in real time; there the
//! two may differ by a stated tolerance (see `agree_live`).

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sluice::{
    CheckError, Decision, FixedWindow, ManualClock, Quota, RateLimiter, SlidingWindowCounter,
    SlidingWindowLog, TokenBucket,
};
use sluice_redis::{Error, RedisAlgorithm, RedisLimiter, RedisOptions, RedisStore};
use support::RedisServer;

static CASE: AtomicU64 = AtomicU64::new(0);

/// Around 2025-11, in µs.
const NOW_US: u64 = 1_763_000_000_000_000;

/// Steps: (microseconds to advance, cost, the index of a quota to change to first). Mostly
/// small steps, some long ones; about one check in five changes the quota (possibly to the
/// one in force).
fn steps(quotas: usize) -> impl Strategy<Value = Vec<(u64, u64, Option<usize>)>> {
    let advance = prop_oneof![
        3 => 0u64..5,
        4 => 0u64..150_000,
        2 => 0u64..3_000_000,
        1 => 0u64..200_000_000,
    ];
    let change = prop::option::weighted(0.2, 0..quotas);
    proptest::collection::vec((advance, 0u64..=12, change), 1..60)
}

fn quotas(list: &[&str]) -> Vec<Quota> {
    list.iter().map(|q| q.parse().expect("quota")).collect()
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// An instant on a window boundary of every quota's window length: there the core's windows
/// (counted from its epoch) and Redis' (counted from Unix time) line up, whatever the changes.
fn window_aligned_start(quotas: &[Quota]) -> u64 {
    let lcm = quotas
        .iter()
        .map(|q| q.fill_time_nanos() / 1000)
        .fold(1, |lcm, w| lcm / gcd(lcm, w) * w);
    NOW_US / lcm * lcm
}

/// A Redis limiter of `algorithm` under `quota` for every key, on `store` with the default prefix.
fn redis_limiter<A: RedisAlgorithm>(algorithm: A, quota: Quota, store: &RedisStore) -> RedisLimiter<A> {
    RedisLimiter::builder(algorithm, quota)
        .unknown_key_quota(quota)
        .build(store.clone())
        .expect("redis limiter")
}

fn same(core: &Result<Decision, CheckError>, redis: &Result<Decision, Error>) -> bool {
    match (core, redis) {
        (Ok(e), Ok(a)) => e == a,
        (Err(e), Err(Error::Check(a))) => e == a,
        _ => false,
    }
}

fn agree<A: RedisAlgorithm + Copy>(algorithm: A, quotas: &[Quota], start: u64) {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let store = rt
        .block_on(RedisStore::connect(&server.url(), RedisOptions::default()))
        .expect("connect");
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (0..quotas.len(), steps(quotas.len()));
    let outcome = runner.run(&strategy, |(first, steps)| {
        let mut quota = quotas[first];
        let key = format!("case-{}", CASE.fetch_add(1, Ordering::Relaxed));
        let clock = ManualClock::new(start * 1000);
        let core = RateLimiter::with_clock(algorithm, quota, clock.clone()).expect("core limiter");
        let _guard = rt.enter();
        let mut redis = redis_limiter(algorithm, quota, &store);
        let mut now = start;
        for (i, (advance, cost, change)) in steps.into_iter().enumerate() {
            now += advance;
            clock.set(now * 1000);
            let mut cost = cost;
            if let Some(next) = change {
                quota = quotas[next];
                core.set_quota(quota).expect("core quota");
                redis = redis_limiter(algorithm, quota, &store);
                // Redis converts a state at the first script run under the new quota, and a
                // cost above the capacity is refused before any: the change's check must run.
                cost = cost.min(quota.capacity());
            }
            let expected = core.check_n(cost);
            let actual = rt.block_on(redis.check_n_at_micros(&key, cost, now));
            prop_assert!(
                same(&expected, &actual),
                "{} {quota} step {i} (t = {now} us, cost {cost}, changed: {}): core {expected:?}, redis {actual:?}",
                algorithm.name(),
                change.is_some()
            );
        }
        Ok::<(), TestCaseError>(())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}

// Rates in pairs with the same rate and another burst (carried exactly), the others carried
// in whole units.
const BUCKET_QUOTAS: &[&str] = &[
    "10/s",
    "10/s burst 4",
    "1.1/s burst 3",
    "1.1/s burst 1",
    "7/min burst 5",
    "3/7s",
    "1000/s burst 50",
    "100/s burst 20",
    "1/s burst 2",
    "1/h burst 2",
];

#[test]
fn redis_gcra_agrees_with_the_core_token_bucket() {
    agree(TokenBucket, &quotas(BUCKET_QUOTAS), NOW_US + 123_457);
}

// Window quotas whose fill time is a whole number of microseconds (the windows' resolution),
// among them two of the same window length and another limit.
const WINDOW_QUOTAS: &[&str] = &[
    "10/s",
    "5/s burst 5",
    "3/2s",
    "100/s burst 10",
    "4/min",
    "1/h burst 3",
];

fn agree_on_windows<A: RedisAlgorithm + Copy>(algorithm: A) {
    let quotas = quotas(WINDOW_QUOTAS);
    agree(algorithm, &quotas, window_aligned_start(&quotas));
}

#[test]
fn redis_fixed_window_agrees_with_the_core() {
    agree_on_windows(FixedWindow);
}

#[test]
fn redis_sliding_window_counter_agrees_with_the_core() {
    agree_on_windows(SlidingWindowCounter);
}

#[test]
fn redis_sliding_window_log_agrees_with_the_core() {
    agree_on_windows(SlidingWindowLog);
}

/// 100/s burst 20 with 5 used, then 1/s burst 2: the 5 units consumed, capped at 2, leave the
/// new bucket empty, on both sides. (Redis once carried the time until full, 50 ms, which is a
/// twentieth of a unit at 1/s, and admitted.)
#[test]
fn a_lower_rate_caps_the_consumption_at_its_capacity_on_both_sides() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let store = rt
        .block_on(RedisStore::connect(&server.url(), RedisOptions::default()))
        .expect("connect");
    let _guard = rt.enter();
    let (fast, slow): (Quota, Quota) = ("100/s burst 20".parse().unwrap(), "1/s burst 2".parse().unwrap());
    let now = NOW_US;
    let clock = ManualClock::new(now * 1000);
    let core = RateLimiter::with_clock(TokenBucket, fast, clock).expect("core limiter");
    let before = redis_limiter(TokenBucket, fast, &store);
    let after = redis_limiter(TokenBucket, slow, &store);

    let taken = rt.block_on(before.check_n_at_micros("issue", 5, now)).unwrap();
    assert_eq!(taken, core.check_n(5).unwrap());
    assert_eq!(taken.remaining(), 15);

    core.set_quota(slow).unwrap();
    let expected = core.check();
    let actual = rt.block_on(after.check_n_at_micros("issue", 1, now)).unwrap();
    assert!(!expected.is_allowed(), "core: {expected:?}");
    assert!(!actual.is_allowed(), "redis: {actual:?}");
    assert_eq!(actual, expected);
    assert_eq!(actual.retry_after_nanos(), 1_000_000_000);
}

/// Replays, from a state written by hand in the format of the scripts before they stored the
/// quota with it (`old_state`, 4 units taken under `10/s` at the start), checks under `10/s`
/// and then under `5/s burst 5` on Redis and on a core limiter that took the same 4 units.
fn replay_old_state<A: RedisAlgorithm + Copy>(
    algorithm: A,
    (server, rt, store): (&RedisServer, &tokio::runtime::Runtime, &RedisStore),
    start: u64,
    old_state: &[&[&str]],
) {
    let (ten, five): (Quota, Quota) = ("10/s".parse().unwrap(), "5/s burst 5".parse().unwrap());
    for command in old_state {
        server.cli(command);
    }
    let clock = ManualClock::new(start * 1000);
    let core = RateLimiter::with_clock(algorithm, ten, clock.clone()).unwrap();
    assert!(core.check_n(4).unwrap().is_allowed());
    let mut redis = redis_limiter(algorithm, ten, store);
    let checks = [
        (150_000, 0, None),
        (150_000, 7, None),
        (150_000, 0, Some(five)),
        (550_000, 2, None),
    ];
    for (at, cost, change) in checks {
        let now = start + at;
        clock.set(now * 1000);
        if let Some(quota) = change {
            core.set_quota(quota).unwrap();
            redis = redis_limiter(algorithm, quota, store);
        }
        let expected = core.check_n(cost);
        let actual = rt.block_on(redis.check_n_at_micros("old", cost, now));
        assert!(
            same(&expected, &actual),
            "{} at +{at} us, cost {cost}: core {expected:?}, redis {actual:?}",
            algorithm.name()
        );
    }
}

/// A state written before the scripts stored its quota with it counts as written under the
/// quota of the check that reads it, and converts at a later change as any other.
#[test]
fn states_written_without_their_quota_count_under_the_current_one() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let store = rt
        .block_on(RedisStore::connect(&server.url(), RedisOptions::default()))
        .expect("connect");
    let _guard = rt.enter();
    let start = window_aligned_start(&quotas(&["10/s", "5/s burst 5"]));
    let on = (&server, &rt, &store);
    // "T": the TAT, 4 units of 100 ms after the start.
    let tat = (start + 400_000).to_string();
    replay_old_state(TokenBucket, on, start, &[&["SET", "{sluice:old}:tb", &tat]]);
    // "W N" and "W A B": 4 units in the window holding the start.
    let window = start / 1_000_000;
    let fixed = format!("{window} 4");
    replay_old_state(FixedWindow, on, start, &[&["SET", "{sluice:old}:fw", &fixed]]);
    let counter = format!("{window} 0 4");
    replay_old_state(
        SlidingWindowCounter,
        on,
        start,
        &[&["SET", "{sluice:old}:sc", &counter]],
    );
    // The log, and its count without `w` and `l`.
    let at = start.to_string();
    replay_old_state(
        SlidingWindowLog,
        on,
        start,
        &[
            &["ZADD", "{sluice:old}:sl", &at, "1:4"],
            &["HSET", "{sluice:old}:sn", "n", "4", "s", "1"],
        ],
    );
}

/// The production path's quota: a unit every 25 ms; windows of 250 ms holding 10.
const LIVE_QUOTA: &str = "40/s burst 10";
const LIVE_RATE_PER_SECOND: u64 = 40;
/// How long each live comparison runs, and the most between two checks.
const LIVE_RUN: Duration = Duration::from_secs(3);
const LIVE_MAX_GAP_MS: u64 = 8;

/// The production path: Redis decides on its own clock (`TIME`), the core on the monotonic
/// clock from its own start, so the windows start where they fall: Redis' on multiples of the
/// window from Unix time, the core's at its creation. One-unit checks go to both, the core's
/// first, then Redis', 1 to 8 ms apart (several a unit: neither side stays full, and every
/// window sees more checks than its capacity). After each, the units each side has admitted
/// so far may differ by at most `tolerance(longest step)`, the longest step being the
/// longest time one check took on both sides.
fn agree_live<A: RedisAlgorithm + Copy>(algorithm: A, tolerance: impl Fn(Quota, Duration) -> u64) {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let store = rt
        .block_on(RedisStore::connect(&server.url(), RedisOptions::default()))
        .expect("connect");
    let _guard = rt.enter();
    let quota: Quota = LIVE_QUOTA.parse().unwrap();
    let redis = redis_limiter(algorithm, quota, &store);
    let core = RateLimiter::new(algorithm, quota).expect("core limiter");
    let (mut by_core, mut by_redis, mut checks) = (0u64, 0u64, 0u64);
    let (mut widest, mut widest_at, mut longest_step) = (0, String::new(), Duration::ZERO);
    // A fixed sequence of gaps (a linear congruential generator), so a failure replays alike.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let start = Instant::now();
    while start.elapsed() < LIVE_RUN {
        let step = Instant::now();
        by_core += u64::from(core.check().is_allowed());
        let decided = rt.block_on(redis.check_n("live", 1)).expect("redis check");
        by_redis += u64::from(decided.is_allowed());
        longest_step = longest_step.max(step.elapsed());
        checks += 1;
        if by_core.abs_diff(by_redis) > widest {
            widest = by_core.abs_diff(by_redis);
            widest_at = format!(
                "after {checks} checks ({:?}), the core admitted {by_core} and Redis {by_redis}",
                start.elapsed()
            );
        }
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        std::thread::sleep(Duration::from_millis(1 + (seed >> 33) % LIVE_MAX_GAP_MS));
    }
    let tolerance = tolerance(quota, longest_step);
    assert!(
        widest <= tolerance,
        "{} {quota}: {widest_at}, at most {tolerance} apart (longest step {longest_step:?})",
        algorithm.name()
    );
    // The run admitted at about the rate: neither side denied (or admitted) everything.
    let expected = LIVE_RATE_PER_SECOND * LIVE_RUN.as_secs();
    for (side, admitted) in [("core", by_core), ("Redis", by_redis)] {
        assert!(
            admitted.abs_diff(expected) <= expected / 4,
            "{}: {side} admitted {admitted} in {LIVE_RUN:?}, about {expected} expected",
            algorithm.name()
        );
    }
}

/// A bucket admits its burst and a unit per unit of time from its first check, less what it
/// holds (under a unit once its burst is spent: every check is of one unit and the bucket is
/// never full after the start). Each side reads the time once per check (Redis' clock and the
/// monotonic clock, on one machine, run alike), the two readings at most a step apart, so the
/// admissions differ by less than one unit plus the rate times twice the longest step (the
/// first check's offset and the current one's).
fn bucket_tolerance(_: Quota, longest_step: Duration) -> u64 {
    let offset_ns = 2 * longest_step.as_nanos();
    1 + u64::try_from((u128::from(LIVE_RATE_PER_SECOND) * offset_ns).div_ceil(1_000_000_000)).unwrap()
}

/// The window algorithms admit about a capacity a window, on grids that start up to a window
/// apart: the fixed window's counts differ by at most the windows one side has begun and the
/// other not, one, so a capacity; the log's units each recur a window after they were taken,
/// at the next check, on both sides alike but for the readings' offset, so each of the
/// capacity's units is at most one admission ahead on one side. The counter's estimate on two
/// grids has no such simple bound: a simulation of the algorithm on both grids, over 3 000
/// offsets and gap sequences of this run's kind, never found them more than 9 apart. A
/// capacity and one covers them all.
fn window_tolerance(quota: Quota, _: Duration) -> u64 {
    quota.capacity() + 1
}

#[test]
fn on_redis_time_the_token_bucket_stays_within_tolerance_of_the_core() {
    agree_live(TokenBucket, bucket_tolerance);
}

#[test]
fn on_redis_time_with_unaligned_windows_the_fixed_window_stays_within_tolerance_of_the_core() {
    agree_live(FixedWindow, window_tolerance);
}

#[test]
fn on_redis_time_with_unaligned_windows_the_sliding_counter_stays_within_tolerance_of_the_core() {
    agree_live(SlidingWindowCounter, window_tolerance);
}

#[test]
fn on_redis_time_the_sliding_log_stays_within_tolerance_of_the_core() {
    agree_live(SlidingWindowLog, window_tolerance);
}
