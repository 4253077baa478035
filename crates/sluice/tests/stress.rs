//! Many threads on one limiter with a frozen clock admit exactly the capacity.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use sluice::{
    Algorithm, ConcurrencyLimiter, FixedWindow, KeyedLimiter, LeakyBucket, ManualClock, Quota, RateLimiter,
    SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};

const THREADS: u64 = 8;
const CAPACITY: u64 = 10_000;

/// Each thread checks until it has seen 100 denials in a row; the admitted total must be the
/// capacity exactly, whatever the interleaving.
fn hammer<A: Algorithm>(algorithm: A) {
    let quota: Quota = format!("1/s burst {CAPACITY}").parse().unwrap();
    let limiter = Arc::new(RateLimiter::with_clock(algorithm, quota, ManualClock::new(42)).unwrap());
    let admitted = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (limiter, admitted) = (Arc::clone(&limiter), Arc::clone(&admitted));
            thread::spawn(move || {
                let mut denials = 0;
                while denials < 100 {
                    if limiter.check().is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                        denials = 0;
                    } else {
                        denials += 1;
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let name = limiter.algorithm().name();
    assert_eq!(admitted.load(Ordering::Relaxed), CAPACITY, "{name}");
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 0, "{name}");
}

#[test]
fn token_bucket_admits_exactly_capacity() {
    hammer(TokenBucket);
}

#[test]
fn leaky_bucket_meter_admits_exactly_capacity() {
    hammer(LeakyBucket::meter());
}

#[test]
fn fixed_window_admits_exactly_capacity() {
    hammer(FixedWindow);
}

#[test]
fn sliding_log_admits_exactly_capacity() {
    hammer(SlidingWindowLog);
}

#[test]
fn sliding_counter_admits_exactly_capacity() {
    hammer(SlidingWindowCounter);
}

/// The shaper admits the burst plus what fits in its maximum delay: at 1/s with a delay of
/// 100 s, exactly capacity + 100.
#[test]
fn leaky_bucket_shaper_admits_exactly_burst_plus_queue() {
    let quota: Quota = format!("1/s burst {CAPACITY}").parse().unwrap();
    let shaper = LeakyBucket::shaper(Duration::from_secs(100));
    let limiter = Arc::new(RateLimiter::with_clock(shaper, quota, ManualClock::new(0)).unwrap());
    let admitted = Arc::new(AtomicU64::new(0));
    thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                while limiter.check().is_allowed() {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(admitted.load(Ordering::Relaxed), CAPACITY + 100);
}

/// Permits held (never released) by 8 threads: exactly the capacity is granted.
#[test]
fn concurrency_limiter_grants_exactly_capacity() {
    let limiter = ConcurrencyLimiter::new(CAPACITY);
    let held: Vec<u64> = thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    let mut permits = Vec::new();
                    while let Ok(p) = limiter.try_acquire(1) {
                        permits.push(p);
                    }
                    let n = permits.len() as u64;
                    std::mem::forget(permits); // keep them out until the count is taken
                    n
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert_eq!(held.iter().sum::<u64>(), CAPACITY);
    assert_eq!(limiter.available(), 0);
}

/// Permits come back when guards drop, across threads, with none lost.
#[test]
fn concurrency_limiter_returns_every_permit() {
    let limiter = ConcurrencyLimiter::new(3);
    thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..10_000 {
                    if let Ok(permit) = limiter.try_acquire(2) {
                        assert!(limiter.available() <= 1);
                        drop(permit);
                    }
                }
            });
        }
    });
    assert_eq!(limiter.available(), 3);
}

/// Quota changes racing with checks: no admission is lost or double-counted across a change.
/// Both quotas have the same capacity and the clock is frozen, so whatever the interleaving,
/// exactly the capacity is admitted.
#[test]
fn quota_changes_under_load_lose_nothing() {
    let slow: Quota = "1/s burst 1000".parse().unwrap();
    let fast: Quota = "3/s burst 1000".parse().unwrap();
    let limiter = RateLimiter::with_clock(TokenBucket, slow, ManualClock::new(7)).unwrap();
    let admitted = AtomicU64::new(0);
    thread::scope(|s| {
        for _ in 0..THREADS - 1 {
            s.spawn(|| {
                for _ in 0..2_000 {
                    if limiter.check().is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        s.spawn(|| {
            for i in 0..500 {
                limiter.set_quota(if i % 2 == 0 { fast } else { slow }).unwrap();
            }
        });
    });
    assert_eq!(admitted.load(Ordering::Relaxed), 1000);
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 0);
}

/// Threads that meet the same new keys at once, on few shards so that they collide on the
/// write lock, must store each key once: a second entry for a key would admit its quota again.
/// Repeated, as a race shows in some runs only.
#[test]
fn threads_racing_to_insert_the_same_new_keys_store_each_once() {
    const KEYS: u64 = 5_000;
    const PER_KEY: u64 = 3;
    let quota: Quota = format!("{PER_KEY}/s").parse().unwrap();
    for trial in 0..10 {
        let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, quota)
            .unknown_key_quota(quota)
            .shards(2)
            .clock(ManualClock::new(7))
            .build()
            .unwrap();
        let admitted = AtomicU64::new(0);
        thread::scope(|scope| {
            for t in 0..THREADS {
                let (limiter, admitted) = (&limiter, &admitted);
                scope.spawn(move || {
                    // Each thread walks the keys from its own starting point, twice round.
                    for step in 0..2 * KEYS {
                        let key = (step + t * KEYS / THREADS) % KEYS;
                        if limiter.check(&key).is_allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(limiter.metrics().entries, KEYS, "trial {trial}");
        assert_eq!(admitted.load(Ordering::Relaxed), KEYS * PER_KEY, "trial {trial}");
    }
}
