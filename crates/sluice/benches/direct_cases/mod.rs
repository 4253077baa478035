//! The direct limiter's cases, shared by `direct` (criterion, one side at a time) and
//! `direct_paired` (sluice and governor taking turns in one process): a `10/s` limit (burst 10)
//! on manual clocks, each constructor returning one check to run again and again.

#![allow(dead_code)] // each bench target uses part of this module

use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use criterion::black_box;
use governor::clock::FakeRelativeClock;
use sluice::{Algorithm, ManualClock, Quota, RateLimiter, TokenBucket};

/// The limit of every manual-clock case: 10/s, burst 10.
pub const RATE: u32 = 10;
/// The burst of the `admitted` cases: governor's largest (a `u32`), far more checks than a run
/// makes.
pub const HUGE_BURST: u32 = u32::MAX;
/// One emission interval of [`RATE`].
pub const INTERVAL: Duration = Duration::from_millis(100);

pub fn sluice_quota(rate: u32) -> Quota {
    Quota::per_second(NonZeroU64::from(nonzero(rate)))
}

pub fn governor_quota(rate: u32) -> governor::Quota {
    governor::Quota::per_second(nonzero(rate))
}

pub fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("rates are positive")
}

/// A sluice check on a manual clock advanced by `step` before each check.
pub fn sluice_stepped<A: Algorithm>(algorithm: A, step: Duration) -> impl FnMut() -> bool {
    let clock = ManualClock::new(0);
    let limiter = RateLimiter::with_clock(algorithm, sluice_quota(RATE), clock.clone()).expect("valid quota");
    move || {
        clock.advance(black_box(step));
        black_box(black_box(&limiter).check()).is_allowed()
    }
}

/// A sluice check of an exhausted limit on a frozen manual clock.
pub fn sluice_exhausted<A: Algorithm>(algorithm: A) -> impl FnMut() -> bool {
    let limiter =
        RateLimiter::with_clock(algorithm, sluice_quota(RATE), ManualClock::new(0)).expect("valid quota");
    while limiter.check().is_allowed() {}
    move || black_box(black_box(&limiter).check()).is_allowed()
}

/// A sluice token bucket check admitted without a clock step: burst [`HUGE_BURST`], frozen.
pub fn sluice_admitted() -> impl FnMut() -> bool {
    let quota = sluice_quota(RATE)
        .with_capacity(u64::from(HUGE_BURST))
        .expect("valid burst");
    let limiter = RateLimiter::with_clock(TokenBucket, quota, ManualClock::new(0)).expect("valid quota");
    move || black_box(black_box(&limiter).check()).is_allowed()
}

/// A governor check on a fake clock advanced by `step` before each check.
pub fn governor_stepped(step: Duration) -> impl FnMut() -> bool {
    let clock = FakeRelativeClock::default();
    let limiter = governor::RateLimiter::direct_with_clock(governor_quota(RATE), clock.clone());
    move || {
        clock.advance(black_box(step));
        black_box(black_box(&limiter).check()).is_ok()
    }
}

/// A governor check of an exhausted limit on a frozen fake clock.
pub fn governor_exhausted() -> impl FnMut() -> bool {
    let limiter =
        governor::RateLimiter::direct_with_clock(governor_quota(RATE), FakeRelativeClock::default());
    while limiter.check().is_ok() {}
    move || black_box(black_box(&limiter).check()).is_ok()
}

/// governor's admitted check without a clock step: burst [`HUGE_BURST`], frozen.
pub fn governor_admitted() -> impl FnMut() -> bool {
    let quota = governor_quota(RATE).allow_burst(nonzero(HUGE_BURST));
    let limiter = governor::RateLimiter::direct_with_clock(quota, FakeRelativeClock::default());
    move || black_box(black_box(&limiter).check()).is_ok()
}
