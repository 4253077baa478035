//! Paying after the response, over sockets: `POST /v1/report` charges usage known after the
//! fact and answers the balance (negative in debt); a rule with `count_over_limit` counts the
//! hits of a request it denies, so Envoy's stream-done call with the response's usage as
//! `hits_addend` meters after the fact over RLS. The checks that follow are denied until the
//! debt is repaid, with the exact retry-after. In memory and on a real Redis (whose token
//! bucket script takes the charge; the window scripts refuse it by name).

mod common;
#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis_support;

use std::net::SocketAddr;
use std::sync::Arc;

use common::{engine_on, exchange, listener};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use redis_support::RedisServer;
use sluice_descriptors::RuleSet;
use sluice_service::{CheckApi, Engine, EngineError, EngineSettings, RateLimitService};

/// 1 000 tokens an hour per user (debt: one period's worth), and one of two quotas whose
/// second floors at 10 below empty.
const RULES: &str = "domain: llm
descriptors:
  - key: user
    rate_limit: {quota: 1000/h, count_over_limit: true}
  - key: team
    rate_limit: {quota: [100/h, 50/day debt 10]}
  - key: window
    rate_limit: {quota: 10/h, algorithm: fixed_window}
";

fn rules() -> RuleSet {
    RuleSet::from_yaml(RULES).unwrap()
}

async fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, serde_json::Value) {
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, body) = exchange(addr, request).await;
    (
        status,
        serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
    )
}

fn one(key: &str, value: &str, hits: u64) -> String {
    format!(
        r#"{{"domain":"llm","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}],"hits":{hits}}}]}}"#
    )
}

async fn serve_api(engine: &Arc<Engine>) -> SocketAddr {
    let (socket, addr) = listener().await;
    tokio::spawn(CheckApi::new(Arc::clone(engine)).serve(socket, std::future::pending()));
    addr
}

async fn reports_charge_below_empty_and_checks_wait_for_the_debt(redis: Option<&RedisServer>) {
    let engine = engine_on(redis, "post", rules(), EngineSettings::default()).await;
    let addr = serve_api(&engine).await;

    // Admitted on one hit, then 1 499 tokens reported: 500 below empty.
    let (status, body) = post(addr, "/v1/check", &one("user", "alice", 1)).await;
    assert_eq!((status, &body["overall_code"]), (200, &"OK".into()), "{body}");
    let (status, body) = post(addr, "/v1/report", &one("user", "alice", 1_499)).await;
    assert_eq!(status, 200, "{body}");
    let status0 = &body["statuses"][0];
    assert_eq!(status0["charged"], 1_499);
    assert_eq!(status0["limit_remaining"], -500);
    assert_eq!(status0["current_limit"]["quota"], "1000/h");
    // 500 units at 1 000 an hour: 30 min until the debt is repaid (less the time the
    // exchanges took, on the service's clock).
    let ms = |value: &serde_json::Value| value.as_u64().unwrap();
    assert!(
        (1_790_000..=1_800_000).contains(&ms(&status0["retry_after_ms"])),
        "{status0}"
    );

    // One hit fits 3.6 s after that.
    let (_, body) = post(addr, "/v1/check", &one("user", "alice", 1)).await;
    assert_eq!(body["overall_code"], "OVER_LIMIT", "{body}");
    let retry = ms(&body["statuses"][0]["retry_after_ms"]);
    assert!((1_793_600..=1_803_600).contains(&retry), "{body}");
    let (_, body) = post(addr, "/v1/check", &one("user", "bob", 1)).await;
    assert_eq!(body["overall_code"], "OK", "another user pays nothing");

    // The floor: at most one period's worth below empty, however much is reported.
    let (_, body) = post(addr, "/v1/report", &one("user", "alice", 1_000_000)).await;
    assert_eq!(body["statuses"][0]["charged"], 500);
    assert_eq!(body["statuses"][0]["limit_remaining"], -1_000);

    // Several quotas: each charged, the tightest answered, each listed; a descriptor no rule
    // limits is charged nothing.
    let body = r#"{"domain":"llm","descriptors":[{"entries":[{"key":"team","value":"red"}],"hits":70},{"entries":[{"key":"nobody","value":"x"}],"hits":5}]}"#;
    let (status, body) = post(addr, "/v1/report", body).await;
    assert_eq!(status, 200, "{body}");
    let team = &body["statuses"][0];
    assert_eq!(team["limit_remaining"], -10, "the day's 50, 10 below: {team}");
    assert_eq!(team["charged"], 60);
    assert_eq!(team["limits"][0]["limit_remaining"], 30);
    assert_eq!(team["limits"][1]["current_limit"]["quota"], "50/day debt 10");
    assert_eq!(body["statuses"][1]["charged"], 0);
    assert!(body["statuses"][1].get("current_limit").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_in_memory() {
    reports_charge_below_empty_and_checks_wait_for_the_debt(None).await;
    let engine = engine_on(None, "post", rules(), EngineSettings::default()).await;
    let addr = serve_api(&engine).await;
    let (status, body) = post(addr, "/v1/report", &one("window", "w", 12)).await;
    assert_eq!(
        (status, &body["statuses"][0]["limit_remaining"]),
        (200, &(-2).into()),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_on_redis() {
    let redis = RedisServer::start();
    reports_charge_below_empty_and_checks_wait_for_the_debt(Some(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_reports_are_refused_with_what_was_wrong() {
    let engine = engine_on(None, "post", rules(), EngineSettings::default()).await;
    let addr = serve_api(&engine).await;
    let (status, body) = post(
        addr,
        "/v1/report",
        r#"{"domain":"llm","descriptors":[],"peek":true}"#,
    )
    .await;
    assert_eq!(status, 400);
    assert!(body["detail"].as_str().unwrap().contains("peek"), "{body}");
    let (status, body) = post(
        addr,
        "/v1/report",
        r#"{"domain":"llm","descriptors":[{"entries":[{"key":"user","value":"a"}],"hits":-3}]}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = post(addr, "/v1/report", r#"{"domain":"llm","descriptors":[]}"#).await;
    assert_eq!(status, 400);
    assert!(body["detail"].as_str().unwrap().contains("descriptors"), "{body}");
    // The largest count a report may carry is charged down to the floor, never a panic.
    let (status, body) = post(addr, "/v1/report", &one("user", "max", u64::MAX)).await;
    assert_eq!(
        (status, &body["statuses"][0]["limit_remaining"]),
        (200, &(-1000).into()),
        "{body}"
    );
}

async fn rls_ask(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    user: &str,
    hits: u32,
) -> (i32, u32) {
    let request = RateLimitRequest {
        domain: "llm".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.into(),
            }],
            ..Default::default()
        }],
        hits_addend: hits,
    };
    let response = client.should_rate_limit(request).await.unwrap().into_inner();
    (response.overall_code, response.statuses[0].limit_remaining)
}

/// Envoy's post-paid meter: a check of one hit on the request, then at stream done the
/// response's usage as `hits_addend`, which a `count_over_limit` rule counts even when it is
/// over (OVER_LIMIT is what that late call is told; nothing is refused by then).
async fn rls_counts_a_denied_requests_hits_with_count_over_limit(redis: Option<&RedisServer>) {
    let engine = engine_on(redis, "post", rules(), EngineSettings::default()).await;
    let (socket, addr) = listener().await;
    tokio::spawn(RateLimitService::new(Arc::clone(&engine)).serve(socket, std::future::pending()));
    let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    const OK: i32 = 1;
    const OVER: i32 = 2;

    assert_eq!(rls_ask(&mut client, "alice", 1).await, (OK, 999));
    // The stream's usage, more than is left (more than the whole quota, too): counted.
    assert_eq!(rls_ask(&mut client, "alice", 1_200).await.0, OVER);
    assert_eq!(rls_ask(&mut client, "alice", 1).await.0, OVER, "201 below empty");
    assert_eq!(rls_ask(&mut client, "bob", 1).await.0, OK);
    // The same without count_over_limit: a denied request counts nothing.
    let plain = engine_on(
        redis,
        "post",
        RuleSet::from_yaml(&RULES.replace(", count_over_limit: true", "")).unwrap(),
        EngineSettings::default(),
    )
    .await;
    let (socket, addr) = listener().await;
    tokio::spawn(RateLimitService::new(plain).serve(socket, std::future::pending()));
    let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    assert_eq!(rls_ask(&mut client, "alice", 1).await, (OK, 999));
    assert_eq!(rls_ask(&mut client, "alice", 1_200).await.0, OVER);
    assert_eq!(rls_ask(&mut client, "alice", 1).await, (OK, 998));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_meters_in_memory() {
    rls_counts_a_denied_requests_hits_with_count_over_limit(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_meters_on_redis() {
    let redis = RedisServer::start();
    rls_counts_a_denied_requests_hits_with_count_over_limit(Some(&redis)).await;
}

/// The HTTP layer on the engine: each response reports its cost in `x-usage`, charged to the
/// user after the response; the user's next request waits for the debt (on Redis the charge
/// is sent on a task, so the test waits for it to land).
async fn the_layer_charges_what_responses_report(redis: Option<&RedisServer>) {
    use axum::Router;
    use axum::extract::Path;
    use axum::routing::get;
    use sluice_http::{ChargeFrom, KeyPart, RateLimitLayer};
    use sluice_service::LayerBackend;

    let engine = engine_on(redis, "post", rules(), EngineSettings::default()).await;
    let layer = RateLimitLayer::builder(LayerBackend::new(Arc::clone(&engine), "llm", "user"))
        .key([KeyPart::Header("x-user".parse().unwrap())])
        .charge_from(ChargeFrom::new("x-usage".parse().unwrap(), 5_000))
        .build()
        .unwrap();
    let counts = layer.clone();
    let router = Router::new()
        .route(
            "/generate/{tokens}",
            get(|Path(tokens): Path<String>| async move { ([("x-usage", tokens)], "generated") }),
        )
        .layer(layer);
    let (socket, addr) = listener().await;
    tokio::spawn(async move { axum::serve(socket, router).await });
    let ask = |tokens: u64, user: &'static str| {
        let request = format!(
            "GET /generate/{tokens} HTTP/1.1\r\nhost: t\r\nx-user: {user}\r\nconnection: close\r\n\r\n"
        );
        exchange(addr, request)
    };
    let (status, body) = ask(1_200, "alice").await;
    assert_eq!((status, body.as_str()), (200, "generated"));
    // 999 left after the request, 1 200 reported: 201 below empty.
    let mut status = 200;
    for _ in 0..100 {
        status = ask(1, "alice").await.0;
        if status == 429 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(status, 429, "the debt holds alice back");
    assert_eq!(ask(1, "bob").await.0, 200);
    let counts = counts.charge_counts().unwrap();
    // Every admitted response was charged: alice's 1 200, then one token each for bob's and
    // any of alice's admitted while her charge was on its way (on Redis).
    assert!(counts.charged >= 2 && counts.uncharged == 0, "{counts:?}");
    assert_eq!(counts.units, 1_200 + (counts.charged - 1), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_charges_in_memory() {
    the_layer_charges_what_responses_report(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_charges_on_redis() {
    let redis = RedisServer::start();
    the_layer_charges_what_responses_report(Some(&redis)).await;
}

/// On Redis a window algorithm takes no charge: a report of one is answered 501 naming it, a
/// `count_over_limit` rule under one is refused at load; never silently uncounted. With
/// Redis gone, a report is answered 503 (nothing was counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_what_cannot_be_charged_is_refused_clearly() {
    let redis = RedisServer::start();
    let engine = engine_on(Some(&redis), "post", rules(), EngineSettings::default()).await;
    let addr = serve_api(&engine).await;
    let (status, body) = post(addr, "/v1/report", &one("window", "w", 5)).await;
    assert_eq!(status, 501, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("fixed window"),
        "{body}"
    );
    let windowed = RULES.replace(
        "algorithm: fixed_window",
        "algorithm: fixed_window, count_over_limit: true",
    );
    let error = engine.reload(RuleSet::from_yaml(&windowed).unwrap()).unwrap_err();
    assert!(matches!(error, EngineError::OverLimitOnRedis { .. }), "{error}");
    assert!(error.to_string().contains("token_bucket"), "{error}");

    drop(redis);
    let (status, body) = post(addr, "/v1/report", &one("user", "alice", 5)).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("not charged"), "{body}");
}
