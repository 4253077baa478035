//! The engine's counters on a real `redis-server`: two engines share each limit, a reload
//! keeps every count (and carries a changed quota over), independent counting, the request's
//! own limit, shadow mode, and a rule Redis cannot hold refused by name.

#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis_support;

use redis_support::RedisServer;
use sluice_descriptors::RuleSet;
use sluice_redis::{FailurePolicy, RedisOptions, RedisStore};
use sluice_service::{
    CheckRequest, Code, Counting, DescriptorRequest, Engine, EngineError, EngineSettings, RedisCounters,
};

const RULES: &str = "
domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: path
    value: /a
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
";

async fn engine(redis: &RedisServer, rules: &str, counting: Counting) -> Engine {
    let store = RedisStore::connect(&redis.url(), RedisOptions::default())
        .await
        .unwrap();
    let counters = RedisCounters {
        policy: FailurePolicy::FailClosed,
        ..RedisCounters::new(store)
    };
    let settings = EngineSettings {
        counting,
        ..EngineSettings::default()
    };
    Engine::on_redis(RuleSet::from_yaml(rules).unwrap(), settings, counters).unwrap()
}

fn request(descriptors: &[(&str, &str)]) -> CheckRequest {
    CheckRequest {
        domain: "d".into(),
        descriptors: descriptors
            .iter()
            .map(|(key, value)| DescriptorRequest {
                entries: vec![((*key).into(), (*value).into())],
                ..Default::default()
            })
            .collect(),
        hits: None,
    }
}

async fn codes(engine: &Engine, descriptors: &[(&str, &str)]) -> (Code, Vec<(Code, u64)>) {
    let verdict = engine.check(&request(descriptors), false).await.unwrap();
    let statuses = verdict.statuses.iter().map(|s| (s.code, s.remaining)).collect();
    (verdict.overall, statuses)
}

async fn remaining(engine: &Engine, descriptors: &[(&str, &str)]) -> Vec<u64> {
    let verdict = engine.check(&request(descriptors), true).await.unwrap();
    verdict.statuses.iter().map(|s| s.remaining).collect()
}

#[tokio::test]
async fn two_engines_share_each_limit_and_a_reload_keeps_the_counts() {
    let redis = RedisServer::start();
    let a = engine(&redis, RULES, Counting::AllOrNothing).await;
    let b = engine(&redis, RULES, Counting::AllOrNothing).await;
    let user = [("user", "u1")];
    assert_eq!(codes(&a, &user).await, (Code::Ok, vec![(Code::Ok, 3)]));
    assert_eq!(codes(&b, &user).await, (Code::Ok, vec![(Code::Ok, 2)]));
    // Same rules again: nothing moves, nothing resets.
    a.reload(RuleSet::from_yaml(RULES).unwrap()).unwrap();
    assert_eq!(remaining(&a, &user).await, [2]);
    // A lower quota for the rule: the two taken stay taken, capped at the new capacity.
    a.reload(RuleSet::from_yaml(&RULES.replace("requests_per_unit: 4", "requests_per_unit: 3")).unwrap())
        .unwrap();
    assert_eq!(codes(&a, &user).await, (Code::Ok, vec![(Code::Ok, 0)]));
    assert_eq!(codes(&a, &user).await.0, Code::OverLimit);
    // b still has the old rules, so its limit is 4 and 3 are taken.
    assert_eq!(codes(&b, &user).await, (Code::Ok, vec![(Code::Ok, 0)]));
    assert_eq!(codes(&b, &user).await.0, Code::OverLimit);
}

#[tokio::test]
async fn all_or_nothing_takes_nothing_from_a_denied_request_and_independent_does() {
    let redis = RedisServer::start();
    let engine_all = engine(&redis, RULES, Counting::AllOrNothing).await;
    let engine_each = engine(&redis, RULES, Counting::Independent).await;
    assert_eq!(codes(&engine_all, &[("path", "/a")]).await.0, Code::Ok);
    let denied = codes(&engine_all, &[("user", "u2"), ("path", "/a")]).await;
    assert_eq!(denied.0, Code::OverLimit);
    assert_eq!(denied.1[1].0, Code::OverLimit);
    assert_eq!(remaining(&engine_all, &[("user", "u2")]).await, [4]);
    // Counted on its own, the first descriptor is spent even though the request is denied.
    let denied = codes(&engine_each, &[("user", "u2"), ("path", "/a")]).await;
    assert_eq!(denied.0, Code::OverLimit);
    assert_eq!(remaining(&engine_each, &[("user", "u2")]).await, [3]);
}

#[tokio::test]
async fn shadow_rules_count_and_admit_and_a_request_limit_has_its_own_counter() {
    let redis = RedisServer::start();
    let engine = engine(&redis, RULES, Counting::AllOrNothing).await;
    let trial = [("trial", "t")];
    assert_eq!(codes(&engine, &trial).await, (Code::Ok, vec![(Code::Ok, 0)]));
    let (overall, statuses) = codes(&engine, &trial).await;
    assert_eq!((overall, statuses[0].0), (Code::Ok, Code::OverLimit));
    // A limit the request sets (2 per hour) counts apart from the rule's 4.
    let mut own = request(&[("user", "u3")]);
    own.descriptors[0].limit = Some("2/h".parse().unwrap());
    for left in [1, 0] {
        let verdict = engine.check(&own, false).await.unwrap();
        assert_eq!((verdict.overall, verdict.statuses[0].remaining), (Code::Ok, left));
    }
    assert_eq!(engine.check(&own, false).await.unwrap().overall, Code::OverLimit);
    assert_eq!(remaining(&engine, &[("user", "u3")]).await, [4]);
    // A request denied by another limit still says its spent shadow limit is over.
    assert_eq!(codes(&engine, &[("path", "/a")]).await.0, Code::Ok);
    let (overall, statuses) = codes(&engine, &[("trial", "t"), ("path", "/a")]).await;
    assert_eq!(overall, Code::OverLimit);
    assert_eq!((statuses[0].0, statuses[1].0), (Code::OverLimit, Code::OverLimit));
}

#[tokio::test]
async fn a_rule_redis_cannot_hold_is_refused_by_its_place() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), RedisOptions::default())
        .await
        .unwrap();
    let rules = RuleSet::from_yaml(
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: day, requests_per_unit: 100000, algorithm: fixed_window}\n",
    )
    .unwrap();
    let error = Engine::on_redis(rules, EngineSettings::default(), RedisCounters::new(store)).unwrap_err();
    assert!(matches!(error, EngineError::Redis { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.starts_with("rule d: k=v: quota 100000/day"), "{message}");
    assert!(message.contains("too large for the Redis backend"), "{message}");
}
