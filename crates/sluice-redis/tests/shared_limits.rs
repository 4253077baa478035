//! Several limiter instances (hosts) sharing limits through a real `redis-server`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice::{
    CheckError, FetchResult, FixedWindow, FnSource, ManualClock, Quota, SlidingWindowCounter,
    SlidingWindowLog, StaticQuotas, TokenBucket,
};
use sluice_redis::{Error, RedisAlgorithm, RedisLimiter, RedisOptions, RedisStore, SetupError};
use support::{RedisCluster, RedisServer};

/// A limit of 100 whose refill (1 a day) and window (100 days) cannot interfere with a test.
const HUNDRED: &str = "100/100day";

fn quota(text: &str) -> Quota {
    text.parse().expect("quota")
}

async fn host<A: RedisAlgorithm>(algorithm: A, store: RedisStore, limit: &str) -> RedisLimiter<A> {
    RedisLimiter::builder(algorithm, quota(limit))
        .unknown_key_quota(quota(limit))
        .hosts(3)
        .build(store)
        .expect("limiter")
}

/// Three hosts (three connections), 48 concurrent callers, 300 attempts at a limit of 100.
async fn three_hosts_admit_exactly<A: RedisAlgorithm>(algorithm: A, stores: [RedisStore; 3], key: &str) {
    let mut hosts = Vec::new();
    for store in stores {
        hosts.push(host(algorithm.clone(), store, HUNDRED).await);
    }
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..48 {
        let limiter = hosts[caller % 3].clone();
        let admitted = Arc::clone(&admitted);
        let key = key.to_string();
        tasks.spawn(async move {
            for _ in 0..(300 / 48 + 1) {
                let decision = limiter.check_n(&key, 1).await.expect("check");
                if decision.is_allowed() {
                    admitted.fetch_add(1, Ordering::Relaxed);
                } else {
                    assert!(decision.retry_after() > Duration::ZERO);
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("caller panicked");
    }
    let name = algorithm.name();
    assert_eq!(admitted.load(Ordering::Relaxed), 100, "{name}: admitted in total");
    for limiter in &hosts {
        let m = limiter.metrics();
        assert_eq!(m.answered_by_policy(), 0, "{name}: every check decided by Redis");
        let peek = limiter.check_n(key, 0).await.expect("peek");
        assert_eq!(peek.remaining(), 0, "{name}: every host sees the limit spent");
    }
}

async fn stores(url: &str) -> [RedisStore; 3] {
    let mut out = Vec::new();
    for _ in 0..3 {
        out.push(
            RedisStore::connect(url, RedisOptions::default())
                .await
                .expect("connect"),
        );
    }
    out.try_into().expect("three stores")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hosts_share_exactly_the_limit_for_every_algorithm() {
    let server = RedisServer::start();
    three_hosts_admit_exactly(TokenBucket, stores(&server.url()).await, "tb").await;
    three_hosts_admit_exactly(FixedWindow, stores(&server.url()).await, "fw").await;
    three_hosts_admit_exactly(SlidingWindowCounter, stores(&server.url()).await, "sc").await;
    three_hosts_admit_exactly(SlidingWindowLog, stores(&server.url()).await, "sl").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_cluster_shares_limits_across_its_slots() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut cluster_stores = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::connect_cluster(&urls, RedisOptions::default())
            .await
            .expect("cluster");
        cluster_stores.push(store);
    }
    let stores = || -> [RedisStore; 3] { cluster_stores.clone().try_into().expect("three") };
    // Keys chosen to land on different masters.
    three_hosts_admit_exactly(TokenBucket, stores(), "alpha").await;
    three_hosts_admit_exactly(FixedWindow, stores(), "bravo").await;
    three_hosts_admit_exactly(SlidingWindowCounter, stores(), "charlie").await;
    three_hosts_admit_exactly(SlidingWindowLog, stores(), "delta").await;
    // Scripts flushed on every master: reloaded where each key lives.
    for node in &cluster.nodes {
        assert_eq!(node.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    }
    three_hosts_admit_exactly(TokenBucket, stores(), "echo").await;
    three_hosts_admit_exactly(SlidingWindowLog, stores(), "foxtrot").await;
    let used: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|n| n.cli(&["DBSIZE"]).trim().parse::<u64>().unwrap_or(0))
        .collect();
    assert!(
        used.iter().filter(|n| **n > 0).count() >= 2,
        "keys spread over masters: {used:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_peek_and_impossible_costs_behave_as_in_the_core() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), RedisOptions::default())
        .await
        .expect("connect");
    let limiter = host(SlidingWindowLog, store, "10/100day").await;
    assert_eq!(limiter.check_n("k", 7).await.expect("check").remaining(), 3);
    let denied = limiter.check_n("k", 4).await.expect("check");
    assert!(!denied.is_allowed());
    assert_eq!(denied.remaining(), 3);
    assert_eq!(limiter.check_n("k", 0).await.expect("peek").remaining(), 3);
    match limiter.check_n("k", 11).await {
        Err(Error::Check(CheckError::CostExceedsCapacity {
            cost: 11,
            capacity: 10,
        })) => {}
        other => panic!("expected CostExceedsCapacity, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_host_clocks_change_nothing() {
    let server = RedisServer::start();
    // Three hosts whose clocks disagree by hours: strict checks use Redis' clock only.
    let mut hosts = Vec::new();
    for skew_hours in [0u64, 5, 29] {
        let store = RedisStore::connect(&server.url(), RedisOptions::default())
            .await
            .expect("connect");
        let clock = ManualClock::new(skew_hours * 3_600_000_000_000);
        let limiter = RedisLimiter::builder(TokenBucket, quota("10/day"))
            .unknown_key_quota(quota("10/day"))
            .local_clock(clock)
            .hosts(3)
            .build(store)
            .expect("limiter");
        hosts.push(limiter);
    }
    let mut admitted = 0;
    for round in 0..30 {
        if hosts[round % 3]
            .check_n("skew", 1)
            .await
            .expect("check")
            .is_allowed()
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10);
    let waits: Vec<Duration> = {
        let mut out = Vec::new();
        for h in &hosts {
            out.push(h.check_n("skew", 0).await.expect("peek").reset_after());
        }
        out
    };
    // Every host reads the same reset time (they differ only by the instants they asked at).
    let spread =
        waits.iter().max().copied().unwrap_or_default() - waits.iter().min().copied().unwrap_or_default();
    assert!(spread < Duration::from_millis(200), "reset times {waits:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_flush_mid_run_is_survived() {
    let server = RedisServer::start();
    let hosts = {
        let mut out = Vec::new();
        for store in stores(&server.url()).await {
            out.push(host(FixedWindow, store, HUNDRED).await);
        }
        out
    };
    let mut admitted = 0;
    for i in 0..150 {
        if i % 25 == 10 {
            assert_eq!(server.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
        }
        if hosts[i % 3]
            .check_n("flush", 1)
            .await
            .expect("check")
            .is_allowed()
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 100);
    for h in &hosts {
        assert_eq!(h.metrics().answered_by_policy(), 0);
        assert_eq!(h.metrics().store.failures, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_expires_when_idle_and_shares_a_hash_tag() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), RedisOptions::default())
        .await
        .expect("connect");
    let a = host(TokenBucket, store.clone(), "5/s").await;
    let b = host(SlidingWindowLog, store.clone(), "5/s").await;
    let c = host(SlidingWindowCounter, store.clone(), "5/s").await;
    let d = host(FixedWindow, store, "5/s").await;
    for key in ["one", "two"] {
        let _ = a.check_n(key, 1).await.expect("check");
        let _ = b.check_n(key, 2).await.expect("check");
        let _ = c.check_n(key, 1).await.expect("check");
        let _ = d.check_n(key, 1).await.expect("check");
    }
    let keys = server.cli(&["--scan"]);
    let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
    for key in ["one", "two"] {
        // A fixed window's key lives until its window ends (windows are aligned to Redis'
        // clock), so one checked just before a window's end may be gone already.
        for suffix in ["tb", "sl", "sc", "sn"] {
            let name = format!("{{sluice:{key}}}:{suffix}");
            assert!(keys.contains(&name.as_str()), "{name} missing from {keys:?}");
        }
    }
    assert!(keys.len() <= 10, "keys: {keys:?}");
    for key in &keys {
        assert!(
            key.starts_with("{sluice:one}:") || key.starts_with("{sluice:two}:"),
            "{key}"
        );
        let ttl: i64 = server.cli(&["PTTL", key]).trim().parse().expect("pttl");
        // -1 would be a key without expiry; -2 one that already expired, 0 one expiring in
        // this millisecond (a fixed window checked at its very end).
        assert!(ttl == -2 || (0..=2_100).contains(&ttl), "{key} has TTL {ttl} ms");
    }
    // Idle keys vanish by themselves.
    support::wait_until("idle keys to expire", Duration::from_secs(10), || {
        server.cli(&["DBSIZE"]).trim() == "0"
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_quotas_come_from_the_core_sources() {
    let server = RedisServer::start();
    let url = server.url();
    let quotas = StaticQuotas::from_iter([
        ("alice".to_string(), quota("5/100day")),
        ("bob".to_string(), quota("2/100day")),
    ]);
    let limiter = RedisLimiter::builder(FixedWindow, quota("3/100day"))
        .source(quotas)
        .unknown_key_quota(quota("1/100day"))
        .connect(&url, RedisOptions::default())
        .await
        .expect("limiter");
    let admitted = |key: &'static str| {
        let limiter = limiter.clone();
        async move {
            let mut n = 0;
            for _ in 0..10 {
                n += u64::from(limiter.check_n(key, 1).await.expect("check").is_allowed());
            }
            n
        }
    };
    assert_eq!(admitted("alice").await, 5);
    assert_eq!(admitted("bob").await, 2);
    assert_eq!(admitted("mallory").await, 1);

    // A slow source: the failsafe quota (3) governs until the fetch lands (6).
    let slow = FnSource(|_key: &String| async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        FetchResult::Ok(Some("6/100day".parse()?))
    });
    let limiter = RedisLimiter::builder(FixedWindow, quota("3/100day"))
        .source(slow)
        .prefix("slow")
        .connect(&url, RedisOptions::default())
        .await
        .expect("limiter");
    assert_eq!(limiter.check_n("carol", 0).await.expect("peek").limit(), 3);
    support::wait_until("the fetched quota", Duration::from_secs(10), || {
        limiter.quota_of("carol").capacity() == 6
    });
    assert_eq!(limiter.check_n("carol", 0).await.expect("peek").limit(), 6);
}

/// Keys whose quota is still being fetched draw on the failsafe pool before Redis is asked:
/// 40 new keys, and 20 checks of one, are admitted the pool's 4, not 10 each (the failsafe
/// quota, which Redis alone would apply per key). Fails without the pool in `prepare`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_keys_share_the_failsafe_pool() {
    let server = RedisServer::start();
    let never = FnSource(|_key: &String| std::future::pending::<FetchResult>());
    let limiter = RedisLimiter::builder(TokenBucket, quota("10/100day"))
        .source(never)
        .failsafe_pool(quota("4/100day"))
        .prefix("pool")
        .connect(&server.url(), RedisOptions::default())
        .await
        .expect("limiter");
    let mut admitted = 0;
    for n in 0..40 {
        let decision = limiter.check_n(&format!("new-{n}"), 1).await.expect("check");
        admitted += u64::from(decision.is_allowed());
    }
    assert_eq!(admitted, 4);
    let denied = limiter.check_n("new-0", 1).await.expect("check");
    assert!(!denied.is_allowed());
    // The pool's next unit: 25 days after it started (the test's own run time less).
    let unit = Duration::from_secs(25 * 86_400);
    let retry = denied.retry_after();
    assert!(
        retry <= unit && retry > unit - Duration::from_secs(60),
        "{retry:?}"
    );

    let one = RedisLimiter::builder(TokenBucket, quota("10/100day"))
        .source(FnSource(|_key: &String| std::future::pending::<FetchResult>()))
        .failsafe_pool(quota("4/100day"))
        .prefix("pool-one")
        .connect(&server.url(), RedisOptions::default())
        .await
        .expect("limiter");
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += u64::from(one.check_n("newcomer", 1).await.expect("check").is_allowed());
    }
    assert_eq!(admitted, 4);
    assert_eq!(
        one.metrics().redis_checks,
        4,
        "denied by the pool without asking Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_url_is_a_clear_error_at_start_up() {
    let options = RedisOptions {
        connect_timeout: Duration::from_millis(500),
        ..RedisOptions::default()
    };
    match RedisStore::connect("http://example", options.clone()).await {
        Err(e @ SetupError::BadUrl { .. }) => assert!(e.to_string().contains("http://example"), "{e}"),
        other => panic!("expected BadUrl, got {other:?}"),
    }
    // Nothing listens on a port just freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    match RedisStore::connect(&url, options).await {
        Err(e @ SetupError::Connect { .. }) => assert!(e.to_string().contains(&url), "{e}"),
        other => panic!("expected Connect, got {other:?}"),
    }
}
