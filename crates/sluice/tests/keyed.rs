//! The keyed limiter: per-key quotas from a source, failsafe, stale, unknown, refresh,
//! live quota change, and bounded memory under a flood of keys.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice::{
    FetchError, FetchResult, FnSource, KeyedLimiter, ManualClock, Quota, QuotaSource, StaticQuotas,
    TokenBucket,
};
use tokio::sync::oneshot;

fn quota(text: &str) -> Quota {
    text.parse().unwrap()
}

/// A source whose answers the test hands over by hand, one per fetch, in order.
#[derive(Clone, Default)]
struct Scripted {
    answers: Arc<Mutex<Vec<oneshot::Receiver<FetchResult>>>>,
    asked: Arc<AtomicU64>,
}

impl Scripted {
    fn next(&self) -> oneshot::Sender<FetchResult> {
        let (tx, rx) = oneshot::channel();
        self.answers.lock().unwrap().push(rx);
        tx
    }
}

impl QuotaSource<String> for Scripted {
    fn fetch(&self, _key: &String) -> impl Future<Output = FetchResult> + Send + 'static {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let rx = self.answers.lock().unwrap().remove(0);
        async move { rx.await.unwrap_or_else(|_| Err(FetchError::new("dropped"))) }
    }
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn failsafe_until_the_fetch_completes_then_the_fetched_quota() {
    let clock = ManualClock::new(0);
    let source = Scripted::default();
    let answer = source.next();
    let limiter = KeyedLimiter::builder(TokenBucket, quota("2/s"))
        .clock(clock.clone())
        .source(source.clone())
        .spawner(|task| {
            tokio::spawn(task);
        })
        .build()
        .unwrap();
    // Failsafe: 2 at once, while the fetch is in flight.
    assert_eq!(limiter.check_n("alice", 0).unwrap().limit(), 2);
    assert!(limiter.check("alice").is_allowed());
    assert!(limiter.check("alice").is_allowed());
    assert!(!limiter.check("alice").is_allowed());
    answer.send(Ok(Some(quota("5/s")))).ok();
    settle().await;
    // The fetched quota applies without a reset: 2 consumed of 5.
    assert_eq!(limiter.quota_of("alice"), Some(quota("5/s")));
    assert_eq!(limiter.check_n("alice", 0).unwrap().remaining(), 3);
    assert_eq!(source.asked.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failed_fetch_keeps_the_stale_quota_and_reports_it() {
    let clock = ManualClock::new(0);
    let source = Scripted::default();
    source.next().send(Ok(Some(quota("5/s")))).ok();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&errors);
    let limiter = KeyedLimiter::builder(TokenBucket, quota("1/s"))
        .clock(clock.clone())
        .refresh_every(Duration::from_secs(10))
        .source(source.clone())
        .spawner(|task| {
            tokio::spawn(task);
        })
        .on_fetch_error(move |key: &String, e| seen.lock().unwrap().push(format!("{key}: {e}")))
        .build()
        .unwrap();
    let _ = limiter.check("bob");
    settle().await;
    assert_eq!(limiter.quota_of("bob"), Some(quota("5/s")));
    // Refresh after the period fails: the quota stays, the error is reported and counted.
    let failure = source.next();
    clock.advance(Duration::from_secs(11));
    assert!(limiter.check("bob").is_allowed());
    failure.send(Err(FetchError::new("accounts service down"))).ok();
    settle().await;
    assert_eq!(limiter.quota_of("bob"), Some(quota("5/s")));
    assert_eq!(errors.lock().unwrap().as_slice(), ["bob: accounts service down"]);
    assert_eq!(limiter.metrics().fetch_errors, 1);
    // The next refresh succeeds with a new quota, applied without a reset.
    let update = source.next();
    clock.advance(Duration::from_secs(11));
    let _ = limiter.check_n("bob", 3).unwrap();
    update.send(Ok(Some(quota("10/s")))).ok();
    settle().await;
    assert_eq!(limiter.quota_of("bob"), Some(quota("10/s")));
    assert_eq!(limiter.check_n("bob", 0).unwrap().remaining(), 7);
    assert_eq!(source.asked.load(Ordering::SeqCst), 3);
}

#[test]
fn static_quotas_apply_at_once_and_unknown_keys_get_the_unknown_quota() {
    let quotas = StaticQuotas::from_iter([
        ("alice".to_string(), quota("1/s")),
        ("carol".to_string(), quota("3/s")),
    ]);
    let limiter = KeyedLimiter::builder(TokenBucket, quota("100/s"))
        .clock(ManualClock::new(0))
        .source(quotas)
        .build()
        .unwrap();
    assert!(limiter.check("alice").is_allowed());
    assert!(!limiter.check("alice").is_allowed());
    assert_eq!(limiter.check_n("carol", 3).unwrap().remaining(), 0);
    let unknown = limiter.check("mallory");
    assert!(!unknown.is_allowed());
    assert_eq!(unknown.limit(), 0);
}

#[test]
fn a_closure_source_resolving_at_once_needs_no_runtime() {
    let source = FnSource(|key: &String| {
        let vip = key.starts_with("vip-");
        async move {
            Ok(Some(if vip {
                "10/s".parse::<Quota>()?
            } else {
                "1/s".parse()?
            }))
        }
    });
    let limiter = KeyedLimiter::builder(TokenBucket, quota("1/s"))
        .clock(ManualClock::new(0))
        .source(source)
        .build()
        .unwrap();
    assert_eq!(limiter.check_n("vip-1", 10).unwrap().remaining(), 0);
    assert!(limiter.check("pleb").is_allowed());
    assert!(!limiter.check("pleb").is_allowed());
}

#[test]
fn a_pending_fetch_without_a_spawner_is_an_error_not_a_hang() {
    let source = FnSource(|_: &String| std::future::pending::<FetchResult>());
    let limiter = KeyedLimiter::builder(TokenBucket, quota("1/s"))
        .clock(ManualClock::new(0))
        .source(source)
        .build()
        .unwrap();
    assert!(limiter.check("x").is_allowed());
    assert!(!limiter.check("x").is_allowed());
    assert_eq!(limiter.metrics().fetch_errors, 1);
}

/// 10M one-shot keys at capacity 100k while 100 hot keys keep requesting: the store stays
/// within capacity and every hot key is admitted exactly what its quota allows.
#[test]
fn a_flood_of_keys_neither_grows_memory_nor_leaks_admissions() {
    let clock = ManualClock::new(0);
    let hot: HashMap<u64, Quota> = (0..100u64).map(|k| (k, quota("100/s burst 10"))).collect();
    let limiter = KeyedLimiter::builder(TokenBucket, quota("1/s"))
        .capacity(100_000)
        .unknown_key_quota(quota("1/s"))
        .clock(clock.clone())
        .source(StaticQuotas::from_iter(hot))
        .build()
        .unwrap();
    let mut admitted = [0u64; 100];
    let mut flood = 1_000u64;
    let rounds = 10_000u64;
    for _ in 0..rounds {
        for _ in 0..1_000 {
            let _ = limiter.check(&flood);
            flood += 1;
        }
        for (k, count) in admitted.iter_mut().enumerate() {
            for _ in 0..2 {
                *count += u64::from(limiter.check(&(k as u64)).is_allowed());
            }
        }
        clock.advance(Duration::from_millis(1)); // 0.1 token per hot key per round
    }
    let metrics = limiter.metrics();
    assert!(metrics.entries <= 100_000 + 64, "{metrics:?}");
    // Burst 10, then 100/s over 10 s of clock: exactly 10 + 999 (the last refill lands after
    // the last round's checks).
    let expected = 10 + (rounds - 1) / 10;
    assert!(
        admitted.iter().all(|&a| a == expected),
        "{admitted:?} != {expected}; {metrics:?}"
    );
    assert!(
        metrics.evicted_idle + metrics.evicted_frequency + metrics.refused > 9_000_000,
        "{metrics:?}"
    );
}

/// An answer sent from another thread after `delay`: 10/s for `vip-` keys, 2/s for others.
fn answer_later(key: &str, delay: Duration) -> oneshot::Receiver<FetchResult> {
    let (tx, rx) = oneshot::channel();
    let vip = key.starts_with("vip-");
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        let _ = tx.send(Ok(Some(if vip { quota("10/s") } else { quota("2/s") })));
    });
    rx
}

#[test]
fn waiting_for_the_first_fetch_starts_a_key_on_its_own_quota() {
    let source = FnSource(|key: &String| {
        let rx = answer_later(key, Duration::from_millis(20));
        async move { rx.await.unwrap_or_else(|_| Err(FetchError::new("dropped"))) }
    });
    let limiter = KeyedLimiter::builder(TokenBucket, quota("1/s"))
        .clock(ManualClock::new(0))
        .source(source)
        .wait_for_first_fetch(Duration::from_secs(30))
        .build()
        .unwrap();
    // Without waiting the failsafe (1/s) would admit one; the fetched 10/s admits ten.
    assert_eq!(limiter.check_n("vip-1", 10).unwrap().remaining(), 0);
    assert_eq!(limiter.quota_of("vip-1"), Some(quota("10/s")));
    assert_eq!(limiter.check("plain").limit(), 2);
    assert_eq!(limiter.metrics().fetch_errors, 0);
}

#[test]
fn a_first_fetch_slower_than_the_wait_falls_back_to_the_failsafe() {
    let source = FnSource(|_: &String| std::future::pending::<FetchResult>());
    let limiter = KeyedLimiter::builder(TokenBucket, quota("1/s"))
        .clock(ManualClock::new(0))
        .source(source)
        .wait_for_first_fetch(Duration::from_millis(20))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let first = limiter.check("x");
    assert!(
        started.elapsed() >= Duration::from_millis(20),
        "it waited for the fetch"
    );
    assert!(first.is_allowed());
    assert_eq!(first.limit(), 1, "the failsafe quota governs");
    assert!(!limiter.check("x").is_allowed());
    // No spawner: the fetch still running is reported, as without the wait.
    assert_eq!(limiter.metrics().fetch_errors, 1);
}

/// A hot key whose bucket is full again between its checks is idle, but it must not be
/// evicted by a flood of one-shot keys: it would lose its fetched quota and start over on the
/// failsafe quota (and be fetched again).
#[test]
fn an_idle_hot_key_keeps_its_place_and_its_quota_under_a_flood() {
    let fetched: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let seen = Arc::clone(&fetched);
    let source = FnSource(move |key: &String| {
        *seen.lock().unwrap().entry(key.clone()).or_default() += 1;
        let quota = if key == "eve" { Some(quota("1000/s")) } else { None };
        async move { Ok(quota) }
    });
    let clock = ManualClock::new(0);
    let limiter = KeyedLimiter::builder(TokenBucket, quota("1/s"))
        .capacity(1000)
        .shards(1)
        .clock(clock.clone())
        .source(source)
        .build()
        .unwrap();
    for round in 0..100_000u64 {
        if round % 10 == 0 {
            let decision = limiter.check("eve");
            assert!(decision.is_allowed() && decision.limit() == 1000, "round {round}");
            // 1 ms later, at 1000/s, eve's bucket is full again: her entry is idle.
            clock.advance(Duration::from_millis(1));
        }
        assert!(!limiter.check(&format!("one-shot-{round}")).is_allowed());
    }
    assert_eq!(
        fetched.lock().unwrap()["eve"],
        1,
        "eve was never evicted and fetched again"
    );
    let metrics = limiter.metrics();
    assert!(
        metrics.entries <= 1000 && metrics.evicted_idle > 90_000,
        "{metrics:?}"
    );
}

#[test]
fn a_source_handing_out_ever_new_quotas_is_capped_and_reported() {
    // Key "any-n" gets n+1 per second: a new quota value for every n.
    let source = FnSource(|key: &String| {
        let n: u64 = key.split_once('-').unwrap().1.parse().unwrap();
        async move { FetchResult::Ok(Some(format!("{}/s", n + 1).parse().unwrap())) }
    });
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&errors);
    let limiter = KeyedLimiter::builder(TokenBucket, quota("7/s"))
        .capacity(4096)
        .source(source)
        .on_fetch_error(move |key: &String, e| seen.lock().unwrap().push((key.clone(), e.to_string())))
        .build()
        .unwrap();
    // 1024 quotas from the source may be booked (the failsafe and unknown-key quotas are
    // booked apart).
    for n in 0..1100u64 {
        let _ = limiter.check(&format!("a-{n}"));
    }
    assert_eq!(limiter.quota_of("a-5"), Some(quota("6/s")));
    assert_eq!(limiter.quota_of("a-1020"), Some(quota("1021/s")));
    // Past the cap, new values are refused: the key stays on the failsafe quota and the hook
    // says why.
    assert_eq!(limiter.quota_of("a-1099"), Some(quota("7/s")));
    {
        let errors = errors.lock().unwrap();
        assert_eq!(limiter.metrics().fetch_errors, errors.len() as u64);
        // Keys a-0..=a-1023 bring 1/s..=1024/s, 1024 in all. The 76 keys a-1024..=a-1099
        // are refused.
        assert_eq!(errors.len(), 76, "{errors:?}");
        assert!(errors[0].1.contains("distinct quotas"), "{}", errors[0].1);
    }
    // A value already booked still applies to a new key.
    let _ = limiter.check(&"b-5".to_string());
    assert_eq!(limiter.quota_of("b-5"), Some(quota("6/s")));
}

#[test]
fn a_capacity_beyond_one_shards_index_takes_more_shards() {
    // One shard indexes at most 1 048 575 keys; asked for one shard and more capacity, the
    // builder adds shards rather than silently holding less.
    let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, quota("1000/s"))
        .unknown_key_quota(quota("1000/s"))
        .capacity(1_200_000)
        .shards(1)
        .build()
        .unwrap();
    assert!(format!("{limiter:?}").contains("shards: 2"), "{limiter:?}");
    for key in 0..1_200_000u64 {
        assert!(limiter.check(&key).is_allowed());
    }
    let held = limiter.metrics().entries;
    // The two shards fill unevenly, so a few keys find theirs full.
    assert!(held > 1_190_000, "{held} keys held");
}

#[test]
fn a_first_fetch_that_fails_leaves_the_key_on_the_failsafe_quota_and_says_why() {
    let source = FnSource(|key: &String| {
        let broken = key == "broken";
        async move {
            if broken {
                Err(FetchError::new("quota store unreachable"))
            } else {
                Ok(Some(quota("2/s")))
            }
        }
    });
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&errors);
    let limiter = KeyedLimiter::builder(TokenBucket, quota("3/s"))
        .unknown_key_quota(Quota::deny_all())
        .source(source)
        .clock(ManualClock::new(0))
        .on_fetch_error(move |key: &String, e| seen.lock().unwrap().push((key.clone(), e.to_string())))
        .build()
        .unwrap();
    // The failsafe quota governs the key: 3 admitted, then denied; not the unknown-key quota
    // (which would deny at once), nor a quota from nowhere.
    for n in 0..3 {
        assert!(limiter.check("broken").is_allowed(), "check {n}");
    }
    assert!(!limiter.check("broken").is_allowed());
    assert_eq!(limiter.quota_of("broken"), Some(quota("3/s")));
    assert_eq!(limiter.metrics().fetch_errors, 1);
    assert_eq!(
        *errors.lock().unwrap(),
        [("broken".to_string(), "quota store unreachable".to_string())]
    );
    // Another key of the same source is not affected.
    assert_eq!(limiter.check_n_quoted("fine", 0).1, quota("2/s"));
    assert_eq!(limiter.metrics().fetch_errors, 1);
}
