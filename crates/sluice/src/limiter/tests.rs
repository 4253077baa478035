//! The direct limiter installs a new limit only at a quota change or an epoch move, never for
//! checks alone: what would grow its memory with every check (a quota whose epoch span is a
//! few nanoseconds) is refused when compiled.

use std::time::Duration;

use proptest::prelude::*;

use super::RateLimiter;
use crate::algorithm::MIN_HORIZON;
use crate::{
    Algorithm, FixedWindow, LeakyBucket, ManualClock, Quota, SlidingWindowCounter, SlidingWindowLog,
    TokenBucket,
};

#[test]
fn a_quota_that_would_move_the_epoch_at_every_check_is_refused_with_the_limit() {
    let quota: Quota = "18446744073709551615/ns burst 1".parse().unwrap();
    let error = RateLimiter::new(TokenBucket, quota).unwrap_err().to_string();
    assert!(error.contains("at least 2^40 ns"), "{error}");
    assert!(error.contains("at most 2^21 (2097152)"), "{error}");
    let error = RateLimiter::new(LeakyBucket::shaper(Duration::ZERO), quota).unwrap_err();
    assert!(error.to_string().contains("2^40 ns"), "{error}");
    // The largest count per period in lowest terms that a bucket holds, and one more.
    assert!(RateLimiter::new(TokenBucket, "2097152/ms".parse().unwrap()).is_ok());
    assert!(RateLimiter::new(TokenBucket, "2097153/ms".parse().unwrap()).is_err());
    // A window of 1 ns admitting 2^60 spans 2 ns.
    let huge: Quota = "1152921504606846976/ns".parse().unwrap();
    let error = RateLimiter::new(FixedWindow, huge).unwrap_err().to_string();
    assert!(error.contains("windows are 1 ns long"), "{error}");
    // The window algorithms that never move their epoch take it.
    assert!(RateLimiter::new(SlidingWindowCounter, huge).is_ok());
}

/// Quotas over the whole range the parser accepts: counts up to 2^64 − 1, periods from 1 ns.
fn any_quota() -> impl Strategy<Value = Quota> {
    let count = prop_oneof![1u64..=1_000, 1u64..=u64::MAX, Just(u64::MAX)];
    let period = prop_oneof![1u64..=1_000, 1u64..=1_000_000_000_000];
    // Written out and parsed: `Quota::new` takes the count as the burst too.
    (count, period, 1u64..=1 << 20).prop_filter_map("a quota", |(count, period, burst)| {
        format!("{count}/{period}ns burst {burst}").parse().ok()
    })
}

/// Checks every `step` ns for `checks` checks on a fresh limiter (if `algorithm` takes the
/// quota), returning how many limits it installed and the span of clock it covered.
fn installs<A: Algorithm>(algorithm: A, quota: Quota, step: u64, checks: u64) -> Option<(usize, u64)> {
    let clock = ManualClock::new(0);
    let limiter = RateLimiter::with_clock(algorithm, quota, clock.clone()).ok()?;
    for _ in 0..checks {
        clock.advance_nanos(step);
        let _ = limiter.check();
    }
    Some((limiter.installed(), step * checks))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever quota an algorithm accepts, checks spread over a span S install at most
    /// 2·S/2^40 new limits (an epoch move keeps at least half of a span of at least 2^40 ns),
    /// so within 2^39 ns none at all. Fails if a quota with a span of a few ns is accepted
    /// (`long_enough` returning `Ok` always): then every check installs one.
    #[test]
    fn checks_alone_install_a_limit_at_most_once_per_half_span(
        quota in any_quota(),
        step in prop_oneof![1u64..=1_000, 1u64..=1 << 36, Just(1u64 << 38)],
        checks in 1u64..=200,
    ) {
        let bound = |span: u64| 1 + usize::try_from(2 * span / MIN_HORIZON).unwrap();
        for result in [
            installs(TokenBucket, quota, step, checks),
            installs(LeakyBucket::shaper(Duration::from_millis(1)), quota, step, checks),
            installs(FixedWindow, quota, step, checks),
            installs(SlidingWindowLog, quota, step, checks),
            installs(SlidingWindowCounter, quota, step, checks),
        ]
        .into_iter()
        .flatten()
        {
            let (installed, span) = result;
            prop_assert!(installed <= bound(span), "{quota}: {installed} limits over {span} ns");
        }
    }
}

/// A limiter whose quota changes a million times, while another thread checks it, holds no
/// more limits at the end than after its first few changes: retired limits are freed.
#[test]
fn a_million_quota_changes_hold_a_bounded_number_of_limits() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let limiter = RateLimiter::with_clock(TokenBucket, "10/s".parse().unwrap(), ManualClock::new(0)).unwrap();
    let quotas: [Quota; 2] = ["10/s".parse().unwrap(), "20/s".parse().unwrap()];
    let done = AtomicBool::new(false);
    let most = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let _ = limiter.check();
            }
        });
        let mut most = 0;
        for i in 0..1_000_000 {
            limiter.set_quota(quotas[i % 2]).unwrap();
            if i % 1_000 == 0 {
                most = most.max(limiter.held());
            }
        }
        done.store(true, Ordering::Relaxed);
        most
    });
    assert_eq!(limiter.installed(), 1_000_001);
    // A scan waits for `RECLAIM_AT` retired limits, and for twice those it had to keep.
    assert!(most <= 4 * super::RECLAIM_AT, "{most} limits held at once");
    // With the checker gone, the next scan frees every retired limit.
    let freed = quotas.iter().cycle().take(1_000).any(|quota| {
        limiter.set_quota(*quota).unwrap();
        limiter.held() == 1
    });
    assert!(freed, "{} limits held", limiter.held());
}
