//! The Redis scripts decide exactly as the core algorithms do, for the same sequence of
//! instants and costs (property-based, against a real `redis-server`).
//!
//! Redis' clock cannot be set, so these checks pass the instant to the script instead
//! (`check_n_at_micros`, the only difference from a normal check); the core limiter gets the
//! same instants from a `ManualClock`. Instants are whole microseconds, Redis' resolution.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sluice::{
    FixedWindow, ManualClock, Quota, RateLimiter, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use sluice_redis::{Error, RedisAlgorithm, RedisLimiter, RedisOptions, RedisStore};
use support::RedisServer;

static CASE: AtomicU64 = AtomicU64::new(0);

/// Steps: (microseconds to advance, cost). Mostly small steps, some long ones.
fn steps() -> impl Strategy<Value = Vec<(u64, u64)>> {
    let advance = prop_oneof![
        3 => 0u64..5,
        4 => 0u64..150_000,
        2 => 0u64..3_000_000,
        1 => 0u64..200_000_000,
    ];
    proptest::collection::vec((advance, 0u64..=12), 1..60)
}

fn agree<A: RedisAlgorithm + Copy>(algorithm: A, quotas: &[&str]) {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let store = rt
        .block_on(RedisStore::connect(&server.url(), RedisOptions::default()))
        .expect("connect");
    let quotas: Vec<Quota> = quotas.iter().map(|q| q.parse().expect("quota")).collect();
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (0..quotas.len(), steps());
    let outcome = runner.run(&strategy, |(index, steps)| {
        let quota = quotas[index];
        let key = format!("case-{}", CASE.fetch_add(1, Ordering::Relaxed));
        // Start on a window boundary, so the core's windows (from its epoch) and Redis' (from
        // Unix time) line up.
        let window_us = quota.fill_time_nanos() / 1000;
        let start = 1_763_000_000_000_000 / window_us * window_us;
        let clock = ManualClock::new(start * 1000);
        let core = RateLimiter::with_clock(algorithm, quota, clock.clone()).expect("core limiter");
        let _guard = rt.enter();
        let redis = RedisLimiter::builder(algorithm, quota)
            .unknown_key_quota(quota)
            .build(store.clone())
            .expect("redis limiter");
        let mut now = start;
        for (i, (advance, cost)) in steps.into_iter().enumerate() {
            now += advance;
            clock.set(now * 1000);
            let expected = core.check_n(cost);
            let actual = rt.block_on(redis.check_n_at_micros(&key, cost, now));
            let same = match (&expected, &actual) {
                (Ok(e), Ok(a)) => e == a,
                (Err(e), Err(Error::Check(a))) => e == a,
                _ => false,
            };
            prop_assert!(
                same,
                "{} {quota} step {i} (t = {now} us, cost {cost}): core {expected:?}, redis {actual:?}",
                algorithm.name()
            );
        }
        Ok::<(), TestCaseError>(())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}

#[test]
fn redis_gcra_agrees_with_the_core_token_bucket() {
    agree(
        TokenBucket,
        &[
            "10/s",
            "1.1/s burst 3",
            "7/min burst 5",
            "3/7s",
            "1000/s burst 50",
            "1/h burst 2",
        ],
    );
}

// Window quotas whose fill time is a whole number of microseconds (the windows' resolution).
const WINDOW_QUOTAS: &[&str] = &["10/s", "3/2s", "100/s burst 10", "4/min", "1/h burst 3"];

#[test]
fn redis_fixed_window_agrees_with_the_core() {
    agree(FixedWindow, WINDOW_QUOTAS);
}

#[test]
fn redis_sliding_window_counter_agrees_with_the_core() {
    agree(SlidingWindowCounter, WINDOW_QUOTAS);
}

#[test]
fn redis_sliding_window_log_agrees_with_the_core() {
    agree(SlidingWindowLog, WINDOW_QUOTAS);
}
