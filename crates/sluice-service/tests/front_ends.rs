//! One rules table through every front end, over sockets, on memory and on a real Redis: the
//! HTTP layer (a request's key as one descriptor), RLS (a client built from Envoy's own message
//! definitions) and the check API answer every request alike and count the same statistics.
//!
//! The layer asks one single-entry descriptor per request, so the nested and `replaces` cases,
//! which need several entries or descriptors, run through RLS and the check API only.

mod common;
mod fields;
#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis_support;

use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use common::{engine_on, exchange, listener};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use redis_support::RedisServer;
use sluice_descriptors::RuleSet;
use sluice_http::{KeyPart, RateLimitLayer};
use sluice_service::{
    CheckApi, Engine, EngineSettings, FieldSet, FrontEnd, LayerBackend, RateLimitService, RuleCounts,
};

const RULES: &str = r#"
domain: d
descriptors:
  - key: account
    value: alice
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: account
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: account
    value: "team-*"
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: account
    value: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: account
    value: free
    rate_limit: {unlimited: true}
  - key: org
    value: acme
    descriptors:
      - key: account
        rate_limit: {unit: hour, requests_per_unit: 2}
  - key: plan
    value: gold
    rate_limit: {unit: hour, requests_per_unit: 10, name: gold, replaces: [{name: basic}]}
  - key: plan
    rate_limit: {unit: hour, requests_per_unit: 1, name: basic}
"#;

/// The single-descriptor requests every front end asks, in order, each with whether it is
/// admitted: exact, key-only, prefix, shadow and unlimited rules.
const ACCOUNTS: &[(&str, bool)] = &[
    ("alice", true),
    ("alice", true),
    ("alice", false),
    ("bob", true),
    ("bob", true),
    ("bob", true),
    ("bob", false),
    ("team-a", true),
    ("team-a", false),
    ("team-b", true),
    ("trial", true),
    ("trial", true),
    ("free", true),
    ("free", true),
];

type Descriptors = &'static [&'static [(&'static str, &'static str)]];

/// The requests of several entries or descriptors (RLS and the check API only), in order,
/// each with whether it is admitted: nested rules, and a rule another one `replaces`.
const COMPOSITE: &[(Descriptors, bool)] = &[
    (&[&[("org", "acme"), ("account", "carol")]], true),
    (&[&[("org", "acme"), ("account", "carol")]], true),
    (&[&[("org", "acme"), ("account", "carol")]], false),
    // `basic` alone allows one, then denies; beside `gold`, which replaces it, it counts not.
    (&[&[("plan", "silver")]], true),
    (&[&[("plan", "silver")]], false),
    (&[&[("plan", "silver")], &[("plan", "gold")]], true),
    (&[&[("plan", "silver")], &[("plan", "gold")]], true),
    // All-or-nothing: alice is spent, so the new account's take is given back.
    (&[&[("account", "dave")], &[("account", "alice")]], false),
    (&[&[("account", "dave")]], true),
];

async fn engine(redis: Option<&RedisServer>) -> Arc<Engine> {
    engine_with(redis, EngineSettings::default()).await
}

async fn engine_with(redis: Option<&RedisServer>, settings: EngineSettings) -> Arc<Engine> {
    // Each engine on its own keys: the front ends are compared, not shared.
    engine_on(redis, "front-ends", RuleSet::from_yaml(RULES).unwrap(), settings).await
}

/// The HTTP layer in front of a handler, keyed by `x-account-id`: each request admitted or not.
async fn through_layer(engine: Arc<Engine>) -> Vec<bool> {
    let layer = RateLimitLayer::builder(LayerBackend::new(engine, "d", "account"))
        .key([KeyPart::Header("x-account-id".parse().unwrap())])
        .build()
        .unwrap();
    let router = Router::new().route("/", get(|| async { "ok" })).layer(layer);
    let (listener, addr) = listener().await;
    tokio::spawn(async move { axum::serve(listener, router).await });
    let mut admitted = Vec::new();
    for (account, _) in ACCOUNTS {
        let request =
            format!("GET / HTTP/1.1\r\nhost: t\r\nx-account-id: {account}\r\nconnection: close\r\n\r\n");
        let (status, _) = exchange(addr, request).await;
        assert!(status == 200 || status == 429, "{account}: {status}");
        admitted.push(status == 200);
    }
    admitted
}

fn json_request(descriptors: &[&[(&str, &str)]]) -> String {
    let descriptors: Vec<String> = (descriptors.iter())
        .map(|entries| {
            let entries: Vec<String> = (entries.iter())
                .map(|(key, value)| format!(r#"{{"key":"{key}","value":"{value}"}}"#))
                .collect();
            format!(r#"{{"entries":[{}]}}"#, entries.join(","))
        })
        .collect();
    let body = format!(r#"{{"domain":"d","descriptors":[{}]}}"#, descriptors.join(","));
    format!(
        "POST /v1/check HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The check API: each request (the single ones, then the composite ones) admitted or not.
async fn through_check_api(engine: Arc<Engine>, composite: bool) -> Vec<bool> {
    let (listener, addr) = listener().await;
    tokio::spawn(CheckApi::new(engine).serve(listener, std::future::pending()));
    let mut admitted = Vec::new();
    for descriptors in requests(composite) {
        let (status, body) = exchange(addr, json_request(descriptors)).await;
        assert_eq!(status, 200, "{body}");
        let ok = body.contains(r#""overall_code":"OK""#);
        assert!(ok || body.contains(r#""overall_code":"OVER_LIMIT""#), "{body}");
        admitted.push(ok);
    }
    admitted
}

/// RLS over gRPC: each request (the single ones, then the composite ones) admitted or not.
async fn through_rls(engine: Arc<Engine>, composite: bool) -> Vec<bool> {
    let (listener, addr) = listener().await;
    tokio::spawn(RateLimitService::new(engine).serve(listener, std::future::pending()));
    let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let mut admitted = Vec::new();
    for descriptors in requests(composite) {
        let request = RateLimitRequest {
            domain: "d".into(),
            descriptors: (descriptors.iter())
                .map(|entries| RateLimitDescriptor {
                    entries: (entries.iter())
                        .map(|(key, value)| Entry {
                            key: (*key).into(),
                            value: (*value).into(),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        };
        let response = client.should_rate_limit(request).await.unwrap().into_inner();
        admitted.push(response.overall_code == 1);
    }
    admitted
}

/// The single-descriptor requests, and then the composite ones if asked.
fn requests(composite: bool) -> Vec<&'static [&'static [(&'static str, &'static str)]]> {
    const SINGLE: &[&[(&str, &str)]] = &[
        &[("account", "alice")],
        &[("account", "bob")],
        &[("account", "team-a")],
        &[("account", "team-b")],
        &[("account", "trial")],
        &[("account", "free")],
    ];
    let mut requests: Vec<&'static [&'static [(&str, &str)]]> = ACCOUNTS
        .iter()
        .map(|(account, _)| {
            let at = SINGLE.iter().position(|d| d[0].1 == *account).unwrap();
            &SINGLE[at..=at]
        })
        .collect();
    if composite {
        requests.extend(COMPOSITE.iter().map(|(descriptors, _)| *descriptors));
    }
    requests
}

/// Every rule's statistics, by its place.
fn stats(engine: &Engine) -> Vec<(String, RuleCounts)> {
    let mut counts: Vec<(String, RuleCounts)> = (engine.rule_counts().into_iter())
        .map(|report| (report.rule.to_string(), report.counts))
        .collect();
    counts.sort_by(|a, b| a.0.cmp(&b.0));
    counts
}

/// The statistics of the rules a single account's request can reach.
fn account_stats(engine: &Engine) -> Vec<(String, RuleCounts)> {
    (stats(engine).into_iter())
        .filter(|(rule, _)| rule.starts_with("d: account"))
        .collect()
}

async fn every_front_end_decides_alike(redis: Option<&RedisServer>) {
    let expected: Vec<bool> = ACCOUNTS.iter().map(|(_, admitted)| *admitted).collect();
    let mut with_composite = expected.clone();
    with_composite.extend(COMPOSITE.iter().map(|(_, admitted)| *admitted));

    let layer = engine(redis).await;
    assert_eq!(through_layer(Arc::clone(&layer)).await, expected, "HTTP layer");
    let api_single = engine(redis).await;
    assert_eq!(
        through_check_api(Arc::clone(&api_single), false).await,
        expected,
        "check API"
    );
    let rls_single = engine(redis).await;
    assert_eq!(through_rls(Arc::clone(&rls_single), false).await, expected, "RLS");
    let api = engine(redis).await;
    assert_eq!(
        through_check_api(Arc::clone(&api), true).await,
        with_composite,
        "check API"
    );
    let rls = engine(redis).await;
    assert_eq!(through_rls(Arc::clone(&rls), true).await, with_composite, "RLS");

    // The same statistics from each, per rule: allowed, denied, shadow-denied and hits.
    let layer_stats = account_stats(&layer);
    assert!(
        layer_stats.iter().any(|(_, c)| c.shadow_denied == 1)
            && layer_stats.iter().any(|(_, c)| c.denied > 0),
        "{layer_stats:?}"
    );
    assert_eq!(layer_stats, account_stats(&api_single), "layer and check API");
    assert_eq!(layer_stats, account_stats(&rls_single), "layer and RLS");
    assert_eq!(stats(&api), stats(&rls), "check API and RLS");
    // Each front end timed its own decisions, and only those.
    assert_eq!(layer.latency(FrontEnd::Http).count, ACCOUNTS.len() as u64);
    assert_eq!(layer.latency(FrontEnd::Rls).count, 0);
    assert_eq!(rls.latency(FrontEnd::Rls).count, with_composite.len() as u64);
    assert_eq!(api.latency(FrontEnd::CheckApi).count, with_composite.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory() {
    every_front_end_decides_alike(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let redis = RedisServer::start();
    every_front_end_decides_alike(Some(&redis)).await;
}

/// Several limits counted through the check API: `RateLimit-Policy` and `RateLimit` name each
/// one (read by a third-party parser), the most restrictive first; `X-RateLimit-*` are the most
/// restrictive's alone.
async fn the_fields_list_every_limit(redis: Option<&RedisServer>) {
    let settings = EngineSettings {
        headers: FieldSet::All,
        ..EngineSettings::default()
    };
    let (listener, addr) = listener().await;
    tokio::spawn(CheckApi::new(engine_with(redis, settings).await).serve(listener, std::future::pending()));
    let (status, body) = exchange(addr, json_request(&[&[("account", "bob")], &[("plan", "gold")]])).await;
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let field = |name: &str| fields::in_answer(&body, name);
    // bob's rule (3 an hour, unnamed: "sluice") has 2 left, gold (10) 9: bob's first.
    assert_eq!(
        fields::items(&field("ratelimit-policy")),
        [
            fields::item("sluice", &[("q", 3), ("w", 3600)]),
            fields::item("gold", &[("q", 10), ("w", 3600)])
        ]
    );
    let left: Vec<(String, i64)> = (fields::items(&field("ratelimit")).into_iter())
        .map(|(name, params)| (name, params[0].1))
        .collect();
    assert_eq!(left, [("sluice".to_owned(), 2), ("gold".to_owned(), 9)]);
    assert_eq!(field("x-ratelimit-remaining"), "2");
    assert_eq!(field("x-ratelimit-limit"), "3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limit_in_the_fields_in_memory() {
    the_fields_list_every_limit(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limit_in_the_fields_on_redis() {
    let redis = RedisServer::start();
    the_fields_list_every_limit(Some(&redis)).await;
}
