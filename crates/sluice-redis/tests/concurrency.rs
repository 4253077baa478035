//! The concurrency limit shared through Redis, with leases that expire.

mod support;

use std::time::Duration;

use sluice::AcquireError;
use sluice_redis::{Error, FailurePolicy, RedisConcurrencyLimiter, RedisOptions, RedisStore};
use support::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hosts_hold_at_most_the_capacity_and_dead_holders_leases_expire() {
    let server = RedisServer::start();
    let mut hosts = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::connect(&server.url(), RedisOptions::default())
            .await
            .expect("connect");
        hosts.push(RedisConcurrencyLimiter::new(
            store,
            "jobs",
            5,
            Duration::from_secs(3),
        ));
    }
    // 30 concurrent attempts: exactly 5 permits granted.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..30 {
        let limiter = hosts[i % 3].clone();
        tasks.spawn(async move { limiter.acquire(1).await });
    }
    let mut held = Vec::new();
    while let Some(done) = tasks.join_next().await {
        match done.expect("task") {
            Ok(permit) => held.push(permit),
            Err(Error::Acquire(AcquireError::Exhausted {
                available: 0,
                capacity: 5,
                ..
            })) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(held.len(), 5);
    assert!(held.iter().all(|p| p.is_shared()));

    // Released permits come back at once.
    let permit = held.pop().expect("a permit");
    permit.release().await;
    let again = hosts[1].acquire(1).await.expect("a released permit comes back");

    // A renewal is acknowledged (that it outlives the first expiry is the test below).
    assert!(again.renew().await);

    // Holders that die without releasing: their leases expire and the permits come back.
    for permit in held {
        std::mem::forget(permit);
    }
    support::wait_until_async(
        "dead holders' leases to expire",
        Duration::from_secs(30),
        || async {
            match hosts[2].acquire(4).await {
                Ok(p) => {
                    p.release().await;
                    true
                }
                Err(_) => false,
            }
        },
    )
    .await;
    match hosts[0].acquire(6).await {
        Err(Error::Acquire(AcquireError::ExceedsCapacity {
            requested: 6,
            capacity: 5,
        })) => {}
        other => panic!("expected ExceedsCapacity, got {other:?}"),
    }
    drop(again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_applies_the_policy_to_permits() {
    let mut server = RedisServer::start();
    let options = RedisOptions {
        timeout: Duration::from_millis(50),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&server.url(), options)
        .await
        .expect("connect");
    let base = RedisConcurrencyLimiter::new(store, "exports", 6, Duration::from_secs(5));
    let share = base.clone().with_policy(FailurePolicy::LocalShare, 3);
    let closed = base.clone().with_policy(FailurePolicy::FailClosed, 3);
    let open = base.with_policy(FailurePolicy::FailOpen, 3);
    server.kill();
    let a = share.acquire(1).await.expect("local share");
    let b = share.acquire(1).await.expect("local share");
    assert!(!a.is_shared() && !b.is_shared());
    assert!(matches!(
        share.acquire(1).await,
        Err(Error::Acquire(AcquireError::Exhausted { .. }))
    ));
    drop(a);
    assert!(
        share.acquire(1).await.is_ok(),
        "a local permit comes back when dropped"
    );
    assert!(matches!(closed.acquire(1).await, Err(Error::Unavailable(_))));
    assert!(open.acquire(6).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_lease_outlives_its_first_expiry() {
    let server = RedisServer::start();
    let mut hosts = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::connect(&server.url(), RedisOptions::default())
            .await
            .expect("connect");
        hosts.push(RedisConcurrencyLimiter::new(
            store,
            "renewed",
            1,
            Duration::from_secs(2),
        ));
    }
    let permit = hosts[0].acquire(1).await.expect("the only permit");
    // Halfway through the lease, renew it: it now ends 2 s from here, 1 s past the first end.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(permit.renew().await);
    // Past the first expiry (2.5 s after the acquire), the permit is still held.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        matches!(
            hosts[1].acquire(1).await,
            Err(Error::Acquire(AcquireError::Exhausted { available: 0, .. }))
        ),
        "the renewed lease still holds the permit past its first expiry"
    );
    // Its holder dies: the renewed lease expires in turn and the permit comes back.
    std::mem::forget(permit);
    support::wait_until_async("the renewed lease to expire", Duration::from_secs(30), || async {
        match hosts[1].acquire(1).await {
            Ok(p) => {
                p.release().await;
                true
            }
            Err(_) => false,
        }
    })
    .await;
}
