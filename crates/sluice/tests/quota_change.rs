//! Changing the quota of a live limiter keeps what was consumed (capped at the new capacity).

use std::time::Duration;

use sluice::{
    Algorithm, FixedWindow, LeakyBucket, ManualClock, Quota, RateLimiter, SlidingWindowCounter,
    SlidingWindowLog, TokenBucket, Unmetered,
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
fn token_bucket_counts_a_partly_consumed_unit_as_consumed_at_another_rate() {
    let clock = ManualClock::new(0);
    let limiter = RateLimiter::with_clock(TokenBucket, quota("10/s"), clock.clone()).unwrap();
    assert!(limiter.check_n(3).unwrap().is_allowed());
    clock.advance_nanos(150_000_000); // 1.5 units refilled: 1.5 consumed
    limiter.set_quota(quota("1/s burst 10")).unwrap();
    // 2 whole units carried: 8 remain, and the next comes back after a whole second.
    let d = limiter.check_n(0).unwrap();
    assert_eq!((d.remaining(), d.reset_after_nanos()), (8, 2_000_000_000));
    // The same rate carries the scaled time exactly: still 2 s until full.
    limiter.set_quota(quota("1/s burst 4")).unwrap();
    let d = limiter.check_n(0).unwrap();
    assert_eq!((d.remaining(), d.reset_after_nanos()), (2, 2_000_000_000));
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
    // A different window length carries the count (8, capped at 5) into the window of the new
    // length that holds the change, on the grid from the epoch: [0, 2 s). The window no longer
    // starts at the change (which Redis, whose grid is Unix time, could not do), so the retry
    // is the 1.4 s left of it.
    limiter.set_quota(quota("5/2s")).unwrap();
    let d = limiter.check();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after_nanos(), 1_400_000_000);
    clock.advance_nanos(1_400_000_000);
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 5);
}

#[test]
fn fixed_window_grids_stay_on_the_epoch_across_changes() {
    let clock = ManualClock::new(0);
    let limiter = RateLimiter::with_clock(FixedWindow, quota("10/s"), clock.clone()).unwrap();
    clock.advance_nanos(1_500_000_000);
    assert!(limiter.check_n(3).unwrap().is_allowed());
    // Into the 2 s window [0, 2 s), then back to the 1 s window [1 s, 2 s) that still holds 3,
    // then 2 s windows again: each length on its own grid from the epoch.
    limiter.set_quota(quota("4/2s")).unwrap();
    clock.advance_nanos(200_000_000);
    limiter.set_quota(quota("10/s")).unwrap();
    let d = limiter.check_n(0).unwrap();
    assert_eq!((d.remaining(), d.reset_after_nanos()), (7, 300_000_000));
    limiter.set_quota(quota("4/2s")).unwrap();
    let d = limiter.check_n(0).unwrap();
    assert_eq!((d.remaining(), d.reset_after_nanos()), (1, 300_000_000));
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
    // The 5 count in the 2 s window holding the change, [0, 2 s), not in one starting at the
    // change (Redis' windows are on Unix time): from 2 s they weigh as the previous window,
    // half of them at 3 s.
    clock.advance_nanos(500_000_000);
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 15);
    clock.advance_nanos(1_000_000_000);
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 17);
}

#[test]
fn sliding_counter_keeps_its_counts_when_the_quota_is_the_same() {
    let clock = ManualClock::new(0);
    let limiter = RateLimiter::with_clock(SlidingWindowCounter, quota("10/s"), clock.clone()).unwrap();
    let _ = limiter.check_n(10).unwrap();
    clock.advance_nanos(1_500_000_000);
    limiter.set_quota(quota("10/s")).unwrap();
    // Unchanged: the previous window's 10 weigh half now and nothing from 2 s on.
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 5);
    clock.advance_nanos(500_000_000);
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 10);
}

/// A check still holding a state that a quota change retired must be refused, not decided on
/// what the retirement left behind (the sliding log once left an empty, live log there).
#[test]
fn a_retired_state_refuses_every_check() {
    fn refuses<A: Algorithm>(algorithm: A) {
        let params = algorithm.params(&quota("4/s")).unwrap();
        let state = algorithm.new_state(&params);
        assert!(algorithm.check(&params, &state, 0, 3).unwrap().is_allowed());
        let _ = algorithm.retire(&state);
        for cost in [0, 1, 4] {
            assert!(
                algorithm.check(&params, &state, 1, cost).is_none(),
                "{}: cost {cost} decided on a retired state",
                algorithm.name()
            );
        }
    }
    refuses(TokenBucket);
    refuses(LeakyBucket::meter());
    refuses(LeakyBucket::shaper(Duration::from_secs(1)));
    refuses(FixedWindow);
    refuses(SlidingWindowCounter);
    refuses(SlidingWindowLog);
}

/// `Unmetered` keeps no state to retire: after a change the limiter must still answer with the
/// new quota, never the one it was built with.
#[test]
fn unmetered_answers_the_new_capacity_after_a_change() {
    let limiter = RateLimiter::with_clock(Unmetered, quota("4/s"), ManualClock::new(0)).unwrap();
    assert_eq!(limiter.check().limit(), 4);
    limiter.set_quota(quota("9/s")).unwrap();
    assert_eq!(limiter.check().limit(), 9);
    assert_eq!(limiter.check_n(7).unwrap().limit(), 9);
}
