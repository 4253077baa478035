//! Changing the quota of a live limiter keeps what was consumed (capped at the new capacity).

use sluice::{
    FixedWindow, ManualClock, Quota, RateLimiter, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};

fn quota(text: &str) -> Quota {
    text.parse().unwrap()
}

#[test]
fn token_bucket_carries_consumption_and_refills_at_the_new_rate() {
    let clock = ManualClock::new(0);
    let limiter = RateLimiter::with_clock(TokenBucket, quota("10/s"), clock.clone()).unwrap();
    assert!(limiter.check_n(10).unwrap().is_allowed());
    limiter.set_quota(quota("100/s burst 20")).unwrap();
    // 10 consumed of 20; the other 10 remain.
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 10);
    clock.advance_nanos(50_000_000); // 50 ms at 100/s refills 5
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 15);
    // Shrinking caps consumption at the new capacity: an empty bucket, not a debt.
    limiter.set_quota(quota("1/s burst 2")).unwrap();
    let d = limiter.check();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after_nanos(), 1_000_000_000);
}

#[test]
fn fixed_window_keeps_its_grid_when_the_window_length_stays() {
    let clock = ManualClock::new(0);
    let limiter = RateLimiter::with_clock(FixedWindow, quota("10/s"), clock.clone()).unwrap();
    clock.advance_nanos(600_000_000);
    assert!(limiter.check_n(8).unwrap().is_allowed());
    limiter.set_quota(quota("20/s burst 20")).unwrap(); // window still 1 s
    let d = limiter.check_n(0).unwrap();
    assert_eq!((d.remaining(), d.reset_after_nanos()), (12, 400_000_000));
    // A different window length starts a new window at the change, with the count carried.
    limiter.set_quota(quota("5/2s")).unwrap();
    let d = limiter.check();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after_nanos(), 2_000_000_000);
}

#[test]
fn sliding_log_keeps_its_entries_and_forgets_the_oldest_beyond_capacity() {
    let clock = ManualClock::new(0);
    let limiter = RateLimiter::with_clock(SlidingWindowLog, quota("10/s"), clock.clone()).unwrap();
    let _ = limiter.check_n(3).unwrap();
    clock.advance_nanos(500_000_000);
    let _ = limiter.check_n(4).unwrap();
    limiter.set_quota(quota("5/s")).unwrap();
    // 7 units logged, capped to the newest 5: 1 of the first batch and the 4.
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 0);
    clock.advance_nanos(500_000_000); // the first batch leaves the window
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 1);
}

#[test]
fn sliding_counter_carries_its_estimate_into_a_new_window() {
    let clock = ManualClock::new(0);
    let limiter = RateLimiter::with_clock(SlidingWindowCounter, quota("10/s"), clock.clone()).unwrap();
    let _ = limiter.check_n(10).unwrap();
    clock.advance_nanos(1_500_000_000); // half the previous window weighs: 5 used
    limiter.set_quota(quota("20/2s")).unwrap();
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 15);
}
