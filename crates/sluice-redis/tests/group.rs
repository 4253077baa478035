//! Several keys decided all or nothing in one atomic call (`RedisLimiter::check_all`), on a
//! real `redis-server` and a Redis Cluster: a group one key denies takes nothing from the
//! others, for every algorithm; keys that hash with another (`hash_tag`) share its slot.

mod support;

use sluice::{FixedWindow, Quota, SlidingWindowCounter, SlidingWindowLog, StaticQuotas, TokenBucket};
use sluice_redis::{Error, RedisAlgorithm, RedisLimiter, RedisOptions, RedisStore};
use support::{RedisCluster, RedisServer};

fn quota(text: &str) -> Quota {
    text.parse().expect("quota")
}

/// `second:NAME` hashes with `NAME`.
fn tag(key: &str) -> Option<(String, String)> {
    key.strip_prefix("second:")
        .map(|first| (first.to_string(), ":second".to_string()))
}

fn limiter<A: RedisAlgorithm>(algorithm: A, store: RedisStore, name: &str) -> RedisLimiter<A> {
    let quotas = StaticQuotas::from_iter([
        (name.to_string(), quota("3/h")),
        (format!("second:{name}"), quota("2/day")),
        (format!("second:{name}-big"), quota("100/h")),
    ]);
    RedisLimiter::builder(algorithm, quota("1/s"))
        .source(quotas)
        .unknown_key_quota(quota("2/h"))
        .hash_tag(tag)
        .prefix("group")
        .build(store)
        .expect("limiter")
}

/// 3 an hour and 2 a day: the day's runs out first, and the denied group takes nothing from
/// the hour's.
async fn all_or_nothing<A: RedisAlgorithm>(algorithm: A, store: RedisStore, name: &str) {
    let limiter = limiter(algorithm.clone(), store, name);
    let second = format!("second:{name}");
    let keys = [name, second.as_str()];
    let algo = algorithm.name();
    for round in 0..2 {
        let answers = limiter.check_all(&keys, 1).await;
        for (answer, taken) in &answers {
            assert!(
                answer.as_ref().unwrap().is_allowed() && *taken,
                "{algo} round {round}"
            );
        }
    }
    let answers = limiter.check_all(&keys, 1).await;
    let (hour, day) = (&answers[0], &answers[1]);
    assert!(!hour.1 && !day.1, "{algo}: nothing taken");
    assert_eq!(hour.0.as_ref().unwrap().remaining(), 1, "{algo}: the hour's look");
    let denial = day.0.as_ref().unwrap();
    assert!(
        !denial.is_allowed() && !denial.retry_after().is_zero(),
        "{algo}: the day's denial"
    );
    // The hour's quota kept its unit: one check of it alone is admitted.
    assert!(limiter.check_n(name, 1).await.unwrap().is_allowed(), "{algo}");
    assert_eq!(
        limiter.check_n(&second, 0).await.unwrap().remaining(),
        0,
        "{algo}"
    );

    // A cost one key can never admit (2 an hour, the unknown-key quota): nothing taken, the
    // other looked at.
    let (fresh, big) = (format!("{name}-big"), format!("second:{name}-big"));
    let answers = limiter.check_all(&[fresh.as_str(), big.as_str()], 3).await;
    assert!(
        matches!(answers[0].0, Err(Error::Check(_))),
        "{algo}: {:?}",
        answers[0].0
    );
    assert_eq!(
        (answers[1].0.as_ref().unwrap().remaining(), answers[1].1),
        (100, false),
        "{algo}"
    );
    assert_eq!(limiter.check_n(&big, 0).await.unwrap().remaining(), 100, "{algo}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_takes_all_or_nothing_for_every_algorithm() {
    let redis = RedisServer::start();
    let store = || async {
        RedisStore::connect(&redis.url(), RedisOptions::default())
            .await
            .unwrap()
    };
    all_or_nothing(TokenBucket, store().await, "tb").await;
    all_or_nothing(FixedWindow, store().await, "fw").await;
    all_or_nothing(SlidingWindowCounter, store().await, "sc").await;
    all_or_nothing(SlidingWindowLog, store().await, "sl").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_shares_one_slot_on_a_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisStore::connect_cluster(&urls, RedisOptions::default())
        .await
        .unwrap();
    for name in ["alpha", "bravo", "charlie"] {
        all_or_nothing(TokenBucket, store.clone(), name).await;
    }
    all_or_nothing(SlidingWindowLog, store, "delta").await;
}
