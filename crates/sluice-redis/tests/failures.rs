//! Redis killed mid-run: each failure policy answers within the timeout, and checks return to
//! Redis by themselves once it answers again.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice::{Quota, TokenBucket};
use sluice_redis::{FailurePolicy, RedisLimiter, RedisOptions};
use support::RedisServer;

fn options() -> RedisOptions {
    RedisOptions {
        timeout: Duration::from_millis(50),
        probe_backoff: Duration::from_millis(20),
        probe_backoff_max: Duration::from_millis(200),
        ..RedisOptions::default()
    }
}

/// Generous: a check must come back near its 50 ms timeout, never hang like a 10 s default.
const NO_HANG: Duration = Duration::from_secs(3);

async fn policy_under_outage(policy: FailurePolicy) {
    let mut server = RedisServer::start();
    let quota: Quota = "30/100day".parse().expect("quota");
    let limiter = RedisLimiter::builder(TokenBucket, quota)
        .unknown_key_quota(quota)
        .policy(policy)
        .hosts(3)
        .connect(&server.url(), options())
        .await
        .expect("limiter");
    for _ in 0..5 {
        assert!(limiter.check_n("k", 1).await.expect("check").is_allowed());
    }
    assert_eq!(limiter.metrics().redis_checks, 5);

    server.kill();
    let mut admitted = 0;
    for _ in 0..40 {
        let started = Instant::now();
        let decision = tokio::time::timeout(NO_HANG, limiter.check_n("k", 1))
            .await
            .expect("a check under outage returns within the timeout")
            .expect("check");
        assert!(started.elapsed() < NO_HANG);
        admitted += u64::from(decision.is_allowed());
    }
    let metrics = limiter.metrics();
    assert!(metrics.store.degraded, "{metrics:?}");
    assert!(metrics.store.outages >= 1);
    match policy {
        FailurePolicy::FailOpen => assert_eq!((admitted, metrics.failed_open), (40, 40)),
        FailurePolicy::FailClosed => assert_eq!((admitted, metrics.failed_closed), (0, 40)),
        // This host's share: 30 / 3 hosts.
        FailurePolicy::LocalShare => assert_eq!((admitted, metrics.local_share), (10, 40)),
    }

    server.restart();
    support::wait_until_async("checks to return to Redis", Duration::from_secs(20), || async {
        let before = limiter.metrics().redis_checks;
        let _ = limiter.check_n("probe", 1).await;
        limiter.metrics().redis_checks > before
    })
    .await;
    let metrics = limiter.metrics();
    assert!(!metrics.store.degraded);
    assert!(metrics.store.recoveries >= 1);
    // The restarted Redis is empty: the key starts afresh, decided by Redis again.
    let before = metrics.redis_checks;
    let decision = limiter.check_n("k", 1).await.expect("check");
    assert_eq!((decision.is_allowed(), decision.remaining()), (true, 29));
    assert_eq!(limiter.metrics().redis_checks, before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_run_fails_open() {
    policy_under_outage(FailurePolicy::FailOpen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_run_fails_closed() {
    policy_under_outage(FailurePolicy::FailClosed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_run_falls_back_to_the_local_share() {
    policy_under_outage(FailurePolicy::LocalShare).await;
}

/// 32 callers check without pause from before Redis dies until they are back on Redis after
/// its restart; Redis stays down until 64 checks have begun and ended while it was, so the
/// outage certainly falls among the checks, and they are answered (by the policy) during it,
/// not held until Redis returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_checks_during_an_outage_do_not_panic_or_hang() {
    const CALLERS: u64 = 32;
    /// Redis stays down until this many checks have begun and ended while it was.
    const IN_OUTAGE: u64 = 64;
    let mut server = RedisServer::start();
    let quota: Quota = "1000/s".parse().expect("quota");
    let limiter = RedisLimiter::builder(TokenBucket, quota)
        .unknown_key_quota(quota)
        .connect(&server.url(), options())
        .await
        .expect("limiter");
    // 0: Redis up; 1: killed (set once the process is gone); 2: being restarted.
    let phase = Arc::new(AtomicU8::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let checks = Arc::new(AtomicU64::new(0));
    let in_outage = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let (limiter, phase, stop, checks, in_outage) = (
            limiter.clone(),
            Arc::clone(&phase),
            Arc::clone(&stop),
            Arc::clone(&checks),
            Arc::clone(&in_outage),
        );
        tasks.spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("k{}", (caller + i) % 7);
                let began = phase.load(Ordering::SeqCst);
                let checked = tokio::time::timeout(NO_HANG, limiter.check_n(&key, 1)).await;
                assert!(matches!(checked, Ok(Ok(_))), "{checked:?}");
                if began == 1 && phase.load(Ordering::SeqCst) == 1 {
                    in_outage.fetch_add(1, Ordering::SeqCst);
                }
                checks.fetch_add(1, Ordering::SeqCst);
                i += 1;
                tokio::task::yield_now().await;
            }
        });
    }
    // The callers are checking on Redis when it dies, and go on checking through the outage.
    support::wait_until_async("checks on Redis", Duration::from_secs(10), || async {
        limiter.metrics().redis_checks >= 2 * CALLERS
    })
    .await;
    server.kill();
    phase.store(1, Ordering::SeqCst);
    let by_policy = limiter.metrics().answered_by_policy();
    support::wait_until_async(
        "checks answered while Redis is down",
        Duration::from_secs(10),
        || async { in_outage.load(Ordering::SeqCst) >= IN_OUTAGE },
    )
    .await;
    let by_policy = limiter.metrics().answered_by_policy() - by_policy;
    phase.store(2, Ordering::SeqCst);
    server.restart();
    // And they go back to Redis by themselves.
    let on_redis = limiter.metrics().redis_checks;
    support::wait_until_async("checks back on Redis", Duration::from_secs(20), || async {
        limiter.metrics().redis_checks > on_redis
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    while let Some(done) = tasks.join_next().await {
        done.expect("caller panicked");
    }
    assert!(
        by_policy >= IN_OUTAGE,
        "{by_policy} checks answered by the policy during the outage"
    );
    let m = limiter.metrics();
    assert_eq!(
        m.redis_checks + m.answered_by_policy(),
        checks.load(Ordering::SeqCst),
        "{m:?}"
    );
}

/// Stalls every client of `server` for `ms` milliseconds (`CLIENT PAUSE … ALL`), as a slow
/// Redis or a network hiccup would.
async fn pause(server: &RedisServer, ms: u64) {
    let client = redis::Client::open(server.url()).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("ALL")
        .query_async(&mut conn)
        .await
        .expect("CLIENT PAUSE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_call_does_not_mark_redis_unavailable_but_three_in_a_row_do() {
    let server = RedisServer::start();
    let quota: Quota = "1000/s".parse().expect("quota");
    let limiter = RedisLimiter::builder(TokenBucket, quota)
        .unknown_key_quota(quota)
        .policy(FailurePolicy::FailClosed)
        .connect(&server.url(), options())
        .await
        .expect("limiter");
    assert!(limiter.check_n("k", 1).await.expect("check").is_allowed());

    // One check times out while Redis stalls: the policy answers it, nobody else.
    pause(&server, 300).await;
    assert!(!limiter.check_n("k", 1).await.expect("check").is_allowed());
    let store = limiter.metrics().store;
    assert_eq!(
        (store.timeouts, store.degraded, store.outages),
        (1, false, 0),
        "{store:?}"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before = limiter.metrics().redis_checks;
    assert!(limiter.check_n("k", 1).await.expect("check").is_allowed());
    assert_eq!(
        limiter.metrics().redis_checks,
        before + 1,
        "the next check goes to Redis"
    );

    // Three failures in a row (the default) mark it unavailable.
    pause(&server, 1000).await;
    for _ in 0..3 {
        let _ = limiter.check_n("k", 1).await.expect("check");
    }
    let store = limiter.metrics().store;
    assert!(store.degraded && store.outages == 1, "{store:?}");
}
