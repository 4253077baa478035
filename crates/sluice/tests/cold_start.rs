//! Cold starts and a misbehaving quota source: the failsafe pool bounds what keys without a
//! quota of their own are admitted together, fetches end (timeout, panic, dropped task) and
//! their keys are fetched again, fetches in flight are bounded, and refresh periods that
//! would wrap are refused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use sluice::{
    FetchError, FetchResult, FnSource, KeyedBuildError, KeyedLimiter, KeyedLink, MAX_REFRESH, ManualClock,
    Quota, RateLimiter, StaticQuotas, Task, TokenBucket, check_chain,
};

fn quota(text: &str) -> Quota {
    text.parse().unwrap()
}

/// A source that never answers, counting the fetches asked of it and those still alive.
#[derive(Clone, Default)]
struct Hangs {
    asked: Arc<AtomicU64>,
    alive: Arc<AtomicU64>,
}

/// Counts one live fetch until dropped.
struct Alive(Arc<AtomicU64>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

type Fetch = std::pin::Pin<Box<dyn Future<Output = FetchResult> + Send>>;

impl Hangs {
    fn source<K>(&self) -> FnSource<impl Fn(&K) -> Fetch + Send + Sync + 'static + use<K>> {
        let (asked, alive) = (Arc::clone(&self.asked), Arc::clone(&self.alive));
        FnSource(move |_: &K| {
            asked.fetch_add(1, Ordering::SeqCst);
            alive.fetch_add(1, Ordering::SeqCst);
            let guard = Alive(Arc::clone(&alive));
            Box::pin(async move {
                let _guard = guard;
                std::future::pending::<FetchResult>().await
            }) as Fetch
        })
    }
}

/// A spawner that keeps its tasks and never runs them.
fn holding() -> (Arc<Mutex<Vec<Task>>>, impl Fn(Task) + Send + Sync + 'static) {
    let tasks = Arc::new(Mutex::new(Vec::new()));
    let held = Arc::clone(&tasks);
    (tasks, move |task| held.lock().unwrap().push(task))
}

fn wait_until(what: &str, ready: impl Fn() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// 1000 new keys against a store full of keys in use (so every newcomer is refused, and was
/// decided on a fresh failsafe state: 1000 admitted), and 1000 more while the store has room
/// (stored on the failsafe quota while their fetch hangs): the pool's burst is all they get,
/// then its rate. Fails with the pool left out of `through_pool`.
#[test]
fn a_key_flood_is_admitted_no_more_than_the_pool_whether_stored_or_refused() {
    let clock = ManualClock::new(0);
    // Keys 0..16 are accounts (known at once); any other key's fetch hangs.
    let source = FnSource(|key: &u64| -> Fetch {
        if *key < 16 {
            Box::pin(std::future::ready(Ok(Some("1000/s".parse().unwrap()))))
        } else {
            Box::pin(std::future::pending())
        }
    });
    let (_tasks, spawner) = holding();
    let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, quota("10/s"))
        .failsafe_pool(quota("50/min burst 5"))
        .capacity(16)
        .shards(1)
        .max_fetches_in_flight(100_000)
        .clock(clock.clone())
        .source(source)
        .spawner(spawner)
        .build()
        .unwrap();
    // Each account checked 15 times a round keeps the most a use count holds, which no
    // newcomer's estimate beats: a newcomer is refused, not let in in an account's place.
    let accounts = || {
        for key in 0..16u64 {
            for _ in 0..15 {
                let _ = limiter.check(&key);
            }
        }
    };
    accounts();
    let mut admitted = 0;
    for key in 1_000..2_000u64 {
        admitted += usize::from(limiter.check(&key).is_allowed());
        clock.advance(Duration::from_micros(10)); // 10 ms in all: under one unit of the pool
        accounts(); // in use: no newcomer may take an account's place
    }
    assert_eq!(limiter.metrics().refused, 1_000, "{:?}", limiter.metrics());
    assert_eq!(admitted, 5, "the pool's burst, not one per key");
    // 1.2 s later: one more unit (50/min), for whichever key asks first.
    clock.advance(Duration::from_millis(1_200));
    let admitted = (2_000..3_000u64)
        .filter(|k| limiter.check(k).is_allowed())
        .count();
    assert_eq!(admitted, 1);

    // With room in the store: each new key is stored on the failsafe quota, still pooled.
    let roomy = KeyedLimiter::<u64, _>::builder(TokenBucket, quota("10/s"))
        .failsafe_pool(quota("50/min burst 5"))
        .max_fetches_in_flight(100_000)
        .clock(clock.clone())
        .source(Hangs::default().source())
        .spawner(holding().1)
        .build()
        .unwrap();
    let admitted = (0..1_000u64).filter(|k| roomy.check(k).is_allowed()).count();
    assert_eq!(admitted, 5);
    assert_eq!(roomy.metrics().entries, 1_000);
}

/// 20 threads check one new key at once while its fetch hangs: its own failsafe quota would
/// admit 10, the pool admits 4.
#[test]
fn concurrent_checks_of_one_cold_key_are_bounded_by_the_pool() {
    let hangs = Hangs::default();
    let (_tasks, spawner) = holding();
    let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, quota("10/s"))
        .failsafe_pool(quota("4/h"))
        .clock(ManualClock::new(0))
        .source(hangs.source())
        .spawner(spawner)
        .build()
        .unwrap();
    let admitted = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..20 {
            scope.spawn(|| {
                if limiter.check("newcomer").is_allowed() {
                    admitted.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    assert_eq!(admitted.load(Ordering::SeqCst), 4);
}

/// With the pool spent, a cold key gets the unknown-key answer with the pool's retry-after,
/// and what its own failsafe state lent the check is given back; once its quota is fetched
/// the key no longer draws on the pool.
#[tokio::test]
async fn a_spent_pool_answers_as_for_an_unknown_key_until_the_key_has_its_quota() {
    let clock = ManualClock::new(0);
    let (answer, rx) = tokio::sync::oneshot::channel::<FetchResult>();
    let rx = Mutex::new(Some(rx));
    let source = FnSource(move |_: &String| {
        let rx = rx.lock().unwrap().take();
        async move {
            match rx {
                Some(rx) => rx.await.unwrap_or_else(|_| Err(FetchError::new("dropped"))),
                None => Ok(None),
            }
        }
    });
    let limiter = KeyedLimiter::builder(TokenBucket, quota("3/s"))
        .failsafe_pool(quota("1/10s"))
        .unknown_key_quota(Quota::deny_all())
        .clock(clock.clone())
        .source(source)
        .spawner(|task| {
            tokio::spawn(task);
        })
        .build()
        .unwrap();
    let (first, under) = limiter.check_n_quoted("alice", 1);
    assert!(first.unwrap().is_allowed());
    assert_eq!(under, quota("3/s"), "the failsafe quota");
    let (denied, under) = limiter.check_n_quoted("alice", 1);
    let denied = denied.unwrap();
    assert!(!denied.is_allowed());
    assert!(under.is_deny_all(), "the unknown-key quota: {under}");
    assert_eq!(
        denied.retry_after(),
        Duration::from_secs(10),
        "the pool's next unit"
    );
    // The denied check took nothing from alice's own failsafe state: 2 of 3 left.
    assert_eq!(limiter.check_n("alice", 0).unwrap().remaining(), 2);
    answer.send(Ok(Some(quota("100/s")))).unwrap();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert_eq!(limiter.quota_of("alice"), Some(quota("100/s")));
    for _ in 0..50 {
        assert!(
            limiter.check("alice").is_allowed(),
            "her own quota, not the spent pool"
        );
    }
}

/// Keys with a quota of their own never touch the pool, spent or not.
#[test]
fn keys_with_their_own_quota_never_draw_on_the_pool() {
    let quotas = StaticQuotas::from_iter((0..10u64).map(|k| (k, quota("5/s"))));
    let limiter = KeyedLimiter::builder(TokenBucket, quota("5/s"))
        .failsafe_pool(quota("1/h"))
        .unknown_key_quota(quota("5/s"))
        .clock(ManualClock::new(0))
        .source(quotas)
        .build()
        .unwrap();
    for key in 0..20u64 {
        for _ in 0..5 {
            assert!(limiter.check(&key).is_allowed(), "key {key}");
        }
    }
}

/// A chain with a cold key that another link denies gives back what the key took from the
/// pool too. Fails without `pool.give_back` in the keyed refund.
#[test]
fn a_denied_chain_gives_back_the_pool() {
    let clock = ManualClock::new(0);
    let (_tasks, spawner) = holding();
    let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, quota("10/s"))
        .failsafe_pool(quota("2/h"))
        .clock(clock.clone())
        .source(Hangs::default().source())
        .spawner(spawner)
        .build()
        .unwrap();
    let closed = RateLimiter::with_clock(TokenBucket, quota("1/h"), clock.clone()).unwrap();
    assert!(closed.check().is_allowed());
    for _ in 0..10 {
        let chain = check_chain(&[(&KeyedLink::new(&limiter, "bob"), 1), (&closed, 1)]).unwrap();
        assert_eq!(chain.denied_by(), Some(1));
    }
    assert!(limiter.check("bob").is_allowed());
    assert!(limiter.check("carol").is_allowed());
    assert!(!limiter.check("dave").is_allowed(), "the pool's 2, and no more");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever mix of new and repeated cold keys, costs and clock steps: everything keys
    /// without their own quota are admitted stays within the pool's token bucket bound,
    /// capacity + ⌊rate × elapsed⌋, and each key within its own failsafe quota's.
    #[test]
    fn cold_admissions_stay_within_the_pool(
        (count, period_ms, burst) in (1u64..=20, 1u64..=2_000, 1u64..=8),
        failsafe_burst in 1u64..=6,
        steps in prop::collection::vec((0u64..40, 0u64..=3, 0u64..=300), 1..300),
    ) {
        let pool = quota(&format!("{count}/{period_ms}ms burst {burst}"));
        let failsafe = quota(&format!("1/s burst {failsafe_burst}"));
        let clock = ManualClock::new(0);
        let (_tasks, spawner) = holding();
        let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, failsafe)
            .failsafe_pool(pool)
            .capacity(8)
            .shards(1)
            .clock(clock.clone())
            .source(Hangs::default().source())
            .spawner(spawner)
            .build()
            .unwrap();
        let (mut admitted, mut per_key) = (0u64, std::collections::HashMap::<u64, u64>::new());
        let mut elapsed = 0u64;
        for (key, cost, advance_ms) in steps {
            clock.advance(Duration::from_millis(advance_ms));
            elapsed += advance_ms * 1_000_000;
            if let Ok(decision) = limiter.check_n(&key, cost.min(failsafe_burst))
                && decision.is_allowed()
            {
                admitted += cost.min(failsafe_burst);
                *per_key.entry(key).or_default() += cost.min(failsafe_burst);
            }
        }
        let (c, p) = pool.reduced_rate();
        let bound = pool.capacity() + u64::try_from(u128::from(elapsed) * u128::from(c) / u128::from(p)).unwrap();
        prop_assert!(admitted <= bound, "{admitted} admitted, the pool {pool} allows {bound} in {elapsed} ns");
        // A key may be evicted and come back fresh: its own bound is per stay, so only the
        // pool's total is exact here; a key never exceeds the pool either way.
        prop_assert!(per_key.values().all(|&n| n <= bound));
    }
}

/// A source that never answers: each fetch ends at the fetch timeout, counted, its task and
/// place freed (no task kept per key), and the key is fetched again a refresh period later.
/// Fails with `Guarded` never timing out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_source_times_out_and_the_key_is_fetched_again() {
    let clock = ManualClock::new(0);
    let hangs = Hangs::default();
    let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, quota("10/s"))
        .fetch_timeout(Duration::from_millis(30))
        .refresh_every(Duration::from_secs(10))
        .clock(clock.clone())
        .source(hangs.source())
        .spawner(|task| {
            tokio::spawn(task);
        })
        .build()
        .unwrap();
    for key in 0..100u64 {
        assert!(limiter.check(&key).is_allowed(), "the failsafe quota meanwhile");
    }
    let metrics = || limiter.metrics();
    tokio::task::spawn_blocking({
        let limiter = limiter.clone();
        move || {
            wait_until("every fetch to time out", || {
                limiter.metrics().fetch_timeouts == 100
            })
        }
    })
    .await
    .unwrap();
    assert_eq!(metrics().fetch_errors, 100);
    assert_eq!(metrics().fetches_in_flight, 0);
    wait_until("the fetches to be dropped", || {
        hangs.alive.load(Ordering::SeqCst) == 0
    });
    // Not fetched again before the refresh period...
    clock.advance(Duration::from_secs(9));
    let _ = limiter.check(&7);
    assert_eq!(hangs.asked.load(Ordering::SeqCst), 100);
    // ...and fetched again after it: the key is not stuck as being fetched.
    clock.advance(Duration::from_secs(2));
    let _ = limiter.check(&7);
    assert_eq!(hangs.asked.load(Ordering::SeqCst), 101);
}

/// A source that panics, when asked or while its answer is polled: a counted fetch error,
/// never the caller's panic, and the key is fetched again a refresh period later. Fails
/// (the check panics) without the `catch_unwind`s in `Guarded`.
#[tokio::test]
async fn a_panicking_source_is_a_counted_fetch_error_and_the_key_is_fetched_again() {
    let clock = ManualClock::new(0);
    let asked = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&asked);
    let source = FnSource(move |key: &String| {
        count.fetch_add(1, Ordering::SeqCst);
        assert!(key != "at-once", "source bug: {key}");
        let later = key == "later";
        async move {
            tokio::task::yield_now().await;
            assert!(!later, "source bug while fetching");
            FetchResult::Ok(Some("5/s".parse().unwrap()))
        }
    });
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&errors);
    let limiter = KeyedLimiter::builder(TokenBucket, quota("2/s"))
        .refresh_every(Duration::from_secs(10))
        .clock(clock.clone())
        .source(source)
        .spawner(|task| {
            tokio::spawn(task);
        })
        .on_fetch_error(move |key: &String, e| seen.lock().unwrap().push(format!("{key}: {e}")))
        .build()
        .unwrap();
    assert_eq!(limiter.check("at-once").limit(), 2, "the failsafe quota");
    assert_eq!(limiter.check("later").limit(), 2);
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    let metrics = limiter.metrics();
    assert_eq!(
        (metrics.fetch_panics, metrics.fetch_errors),
        (2, 2),
        "{metrics:?}"
    );
    assert_eq!(metrics.fetches_in_flight, 0);
    let mut errors = errors.lock().unwrap().clone();
    errors.sort();
    assert_eq!(
        errors,
        [
            "at-once: the quota source panicked: source bug: at-once",
            "later: the quota source panicked: source bug while fetching",
        ]
    );
    clock.advance(Duration::from_secs(11));
    let _ = limiter.check("later");
    assert_eq!(
        asked.load(Ordering::SeqCst),
        3,
        "fetched again after the refresh period"
    );
}

/// At most `max_fetches_in_flight` fetch tasks at once: beyond, a new key starts without a
/// task (on the failsafe quota and the pool) and is fetched at a later check once a place is
/// free. Fails if places are never refused.
#[test]
fn fetches_in_flight_are_bounded_and_skipped_keys_are_fetched_later() {
    let hangs = Hangs::default();
    let (tasks, spawner) = holding();
    let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, quota("10/s"))
        .failsafe_pool(quota("1000/s"))
        .max_fetches_in_flight(4)
        .clock(ManualClock::new(0))
        .source(hangs.source())
        .spawner(spawner)
        .build()
        .unwrap();
    for key in 0..100u64 {
        assert!(limiter.check(&key).is_allowed());
    }
    assert_eq!(tasks.lock().unwrap().len(), 4, "tasks started");
    let metrics = limiter.metrics();
    assert_eq!((metrics.fetches_skipped, metrics.fetches_in_flight), (96, 4));
    assert_eq!(metrics.entries, 100);
    // Nothing frees a place: checking a skipped key again starts nothing.
    let _ = limiter.check(&50);
    assert_eq!(tasks.lock().unwrap().len(), 4);
    // The held tasks end (dropped: a failed fetch each), freeing their places; a skipped key's
    // next check takes one.
    tasks.lock().unwrap().clear();
    assert_eq!(limiter.metrics().fetches_in_flight, 0);
    let _ = limiter.check(&50);
    assert_eq!(tasks.lock().unwrap().len(), 1, "key 50 fetched at last");
    assert_eq!(hangs.asked.load(Ordering::SeqCst), 101);
}

/// A spawner that drops a fetch's task: a failed fetch, not a key marked as being fetched
/// forever.
#[test]
fn a_dropped_fetch_task_is_a_failed_fetch_and_the_key_is_fetched_again() {
    let clock = ManualClock::new(0);
    let hangs = Hangs::default();
    let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, quota("10/s"))
        .refresh_every(Duration::from_secs(1))
        .clock(clock.clone())
        .source(hangs.source())
        .spawner(drop)
        .build()
        .unwrap();
    let _ = limiter.check(&1);
    let metrics = limiter.metrics();
    assert_eq!((metrics.fetch_errors, metrics.fetches_in_flight), (1, 0));
    clock.advance(Duration::from_secs(2));
    let _ = limiter.check(&1);
    assert_eq!(hangs.asked.load(Ordering::SeqCst), 2);
}

/// A refresh period of 2^52 ns wrapped the 32-bit age it was counted in to 0: a refresh
/// every millisecond (and any period beyond, some shorter one). Ages no longer wrap: such
/// periods hold, and only what no clock reading can span is refused, saying the limit.
#[test]
fn long_refresh_periods_hold_and_beyond_292_years_are_refused() {
    let build = |period| {
        KeyedLimiter::<u64, _>::builder(TokenBucket, quota("1/s"))
            .refresh_every(period)
            .build()
    };
    let error = build(Duration::MAX).unwrap_err();
    assert_eq!(error, KeyedBuildError::RefreshTooLong(Duration::MAX));
    assert!(
        error
            .to_string()
            .contains("at most 2^63 − 1 ns (about 292 years)"),
        "{error}"
    );
    assert!(build(MAX_REFRESH).is_ok());

    for period in [1u64 << 52, (1 << 52) + (1 << 20), 1 << 60] {
        let clock = ManualClock::new(0);
        let asked = Arc::new(AtomicU64::new(0));
        let count = Arc::clone(&asked);
        let source = FnSource(move |_: &u64| {
            count.fetch_add(1, Ordering::SeqCst);
            async { FetchResult::Ok(Some("5/s".parse().unwrap())) }
        });
        let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, quota("1/s"))
            .refresh_every(Duration::from_nanos(period))
            .clock(clock.clone())
            .source(source)
            .build()
            .unwrap();
        let _ = limiter.check(&1);
        for step in [5_000_000, 1 << 30, period / 2, period / 2 - (1 << 30) - 5_000_001] {
            clock.advance_nanos(step);
            let _ = limiter.check(&1);
            assert_eq!(
                asked.load(Ordering::SeqCst),
                1,
                "period {period}: fetched again early"
            );
        }
        clock.advance_nanos(1);
        let _ = limiter.check(&1);
        assert_eq!(
            asked.load(Ordering::SeqCst),
            2,
            "period {period}: fetched again when due"
        );
    }
}
