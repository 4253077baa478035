//! Moving a keyed limiter's keys into one built with other settings: every later decision is
//! the one a lone limiter per key gives when its quota changes at the same instants (the quota
//! change rule), for every algorithm, with quotas from the source and the unknown-key quota.

use std::collections::HashMap;

use proptest::prelude::*;
use sluice::{
    Algorithm, FixedWindow, KeyedLimiter, LeakyBucket, ManualClock, Quota, RateLimiter, SlidingWindowCounter,
    SlidingWindowLog, StaticQuotas, TokenBucket,
};

const QUOTAS: [&str; 6] = ["3/s", "5/2s", "2/s", "10/s", "4/500ms", "1/s"];
/// Keys 0 and 1 have quotas from the source; 2 and 3 are unknown to it.
const KEYS: u64 = 4;

fn quota(i: usize) -> Quota {
    QUOTAS[i % QUOTAS.len()].parse().unwrap()
}

#[derive(Debug, Clone)]
struct Case {
    /// Key 0's and key 1's quotas, then key 0's in the new source.
    known: [usize; 3],
    /// The unknown-key quota before and after.
    unknown: [usize; 2],
    /// (key, cost, ms the clock moves first), before and after the move.
    before: Vec<(u64, u64, u64)>,
    after: Vec<(u64, u64, u64)>,
}

fn steps() -> impl Strategy<Value = Vec<(u64, u64, u64)>> {
    prop::collection::vec((0..KEYS, 0..=3u64, 0..700u64), 1..40)
}

fn case() -> impl Strategy<Value = Case> {
    (
        [0..6usize, 0..6usize, 0..6usize],
        [0..6usize, 0..6usize],
        steps(),
        steps(),
    )
        .prop_map(|(known, unknown, before, after)| Case {
            known,
            unknown,
            before,
            after,
        })
}

/// The reference: one lone limiter per key, made at the key's first check (where the keyed
/// store starts the key's epoch).
struct Lone<A: Algorithm> {
    algorithm: A,
    clock: ManualClock,
    limits: HashMap<u64, RateLimiter<A, ManualClock>>,
}

impl<A: Algorithm + Copy> Lone<A> {
    fn check(&mut self, key: u64, quota: Quota, cost: u64) -> String {
        let limiter = self
            .limits
            .entry(key)
            .or_insert_with(|| RateLimiter::with_clock(self.algorithm, quota, self.clock.clone()).unwrap());
        format!("{:?}", limiter.check_n(cost))
    }
}

fn run<A: Algorithm + Copy>(algorithm: A, case: &Case) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(1_000_000_007);
    let [q0, q1, q0_after] = case.known.map(quota);
    let [u_before, u_after] = case.unknown.map(quota);
    let source = |q0: Quota| StaticQuotas::from_iter([(0u64, q0), (1, q1)]);
    let running = KeyedLimiter::builder(algorithm, "1/h".parse().unwrap())
        .source(source(q0))
        .unknown_key_quota(u_before)
        .capacity(64)
        .shards(4)
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut lone = Lone {
        algorithm,
        clock: clock.clone(),
        limits: HashMap::new(),
    };
    let quota_before = |key: u64| match key {
        0 => q0,
        1 => q1,
        _ => u_before,
    };
    for &(key, cost, ms) in &case.before {
        clock.advance_nanos(ms * 1_000_000);
        let expected = lone.check(key, quota_before(key), cost);
        let got = format!("{:?}", running.check_n(&key, cost));
        prop_assert_eq!(got, expected, "before, key {}", key);
    }

    let next = KeyedLimiter::builder(algorithm, "2/h".parse().unwrap())
        .source(source(q0_after))
        .unknown_key_quota(u_after)
        .capacity(1000)
        .clock(clock.clone())
        .build()
        .unwrap();
    let migrated = running.migrate_into(&next);
    prop_assert_eq!(migrated.moved, lone.limits.len() as u64);
    prop_assert_eq!(migrated.dropped, 0);
    // The unknown keys change quota with the move; key 0's new quota comes from the new
    // source at its first check after it (decided on the old one, then applied).
    for (key, limiter) in &lone.limits {
        let now = if *key >= 2 { u_after } else { quota_before(*key) };
        limiter.set_quota(now).unwrap();
    }
    let mut refreshed = HashMap::new();
    let quota_after = |key: u64| match key {
        0 => q0_after,
        1 => q1,
        _ => u_after,
    };
    for &(key, cost, ms) in &case.after {
        clock.advance_nanos(ms * 1_000_000);
        let held = lone.limits.contains_key(&key);
        let first = *refreshed.entry(key).or_insert(true);
        let expected = if held && first {
            let answer = lone.check(key, quota_before(key), cost);
            lone.limits[&key].set_quota(quota_after(key)).unwrap();
            answer
        } else {
            lone.check(key, quota_after(key), cost)
        };
        refreshed.insert(key, false);
        let got = format!("{:?}", next.check_n(&key, cost));
        prop_assert_eq!(got, expected, "after, key {}", key);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn token_bucket(case in case()) { run(TokenBucket, &case)?; }

    #[test]
    fn leaky_bucket(case in case()) { run(LeakyBucket::meter(), &case)?; }

    #[test]
    fn fixed_window(case in case()) { run(FixedWindow, &case)?; }

    #[test]
    fn sliding_window_log(case in case()) { run(SlidingWindowLog, &case)?; }

    #[test]
    fn sliding_window_counter(case in case()) { run(SlidingWindowCounter, &case)?; }
}
