//! Charges after the fact on a real `redis-server`: taken whatever is left, down to the quota's
//! debt, shared by every host, and repaid before the key is admitted again; as the core
//! charges the same quota (the same units charged, the same debt).

mod support;

use sluice::{FixedWindow, ManualClock, Quota, RateLimiter, TokenBucket};
use sluice_redis::{Error, RedisAlgorithm, RedisLimiter, RedisOptions, RedisStore};
use support::RedisServer;

fn quota(text: &str) -> Quota {
    text.parse().expect("quota")
}

async fn host<A: RedisAlgorithm>(algorithm: A, redis: &RedisServer, limit: &str) -> RedisLimiter<A> {
    let store = RedisStore::connect(&redis.url(), RedisOptions::default())
        .await
        .expect("store");
    RedisLimiter::builder(algorithm, quota(limit))
        .unknown_key_quota(quota(limit))
        .prefix("charge")
        .build(store)
        .expect("limiter")
}

/// Two hosts, one key: a charge on one is the debt the other's checks see. Each charge is
/// compared with the core's on the same quota, on a manual clock standing still: Redis' clock
/// moves a few milliseconds, a fraction of a unit at a day's rate, so a charge that reaches
/// the floor may take that fraction more (a part of a unit counts as one).
async fn shared_debt<A: RedisAlgorithm + Clone>(algorithm: A, redis: &RedisServer, key: &str) {
    let limit = "100/day debt 50";
    let (one, two) = (
        host(algorithm.clone(), redis, limit).await,
        host(algorithm.clone(), redis, limit).await,
    );
    let core = RateLimiter::with_clock(algorithm, quota(limit), ManualClock::new(0)).unwrap();

    assert!(one.check_n(key, 30).await.unwrap().is_allowed());
    assert!(core.check_n(30).unwrap().is_allowed());
    for cost in [50, 40, 1_000_000, u64::MAX] {
        let (shared, own) = (two.charge_n(key, cost).await.unwrap(), core.charge_n(cost));
        assert_eq!(shared.debt(), own.debt(), "charge of {cost}");
        assert!(
            (own.charged()..=own.charged() + 1).contains(&shared.charged()),
            "charge of {cost}"
        );
        assert_eq!(shared.balance(), own.balance());
        assert_eq!(shared.decision().is_allowed(), own.decision().is_allowed());
    }
    assert_eq!(core.charge_n(0).balance(), -50, "at the floor");
    let denied = one.check_n(key, 1).await.unwrap();
    assert!(!denied.is_allowed());
    // 51 units at 100 a day: 11 h 0 min 58 s (less the milliseconds the test took).
    let retry = denied.retry_after().as_secs();
    assert!((44_000..=44_064).contains(&retry), "{retry}");
    assert!(one.check_n("another", 1).await.unwrap().is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_is_shared_and_repaid_before_admission() {
    let redis = RedisServer::start();
    shared_debt(TokenBucket, &redis, "tb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_scripts_refuse_a_charge_by_name() {
    let redis = RedisServer::start();
    let limiter = host(FixedWindow, &redis, "10/s").await;
    let error = limiter.charge_n("k", 3).await.unwrap_err();
    assert!(matches!(error, Error::ChargeUnsupported { .. }), "{error}");
    assert!(error.to_string().contains("fixed window"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_redis_does_not_take_is_an_error_not_a_count() {
    let redis = RedisServer::start();
    let limiter = host(TokenBucket, &redis, "10/s").await;
    drop(redis);
    let error = limiter.charge_n("k", 3).await.unwrap_err();
    assert!(matches!(error, Error::NotCharged(_)), "{error}");
}
