//! Several quotas on one rule (`quota: ["3/h", "2/day"]`), over sockets through every front end,
//! on memory and on a real Redis: decided all or nothing (a request one quota denies takes
//! nothing from the others), answered by the tightest, and carried through reloads (a quota
//! kept keeps its count, a quota added starts full).

mod common;
mod fields;
#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis_support;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use common::{engine_on, exchange, exchange_with_head, listener};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use redis_support::RedisServer;
use sluice_descriptors::RuleSet;
use sluice_http::{KeyPart, RateLimitLayer};
use sluice_service::{CheckApi, Counting, Engine, EngineSettings, FieldSet, LayerBackend, RateLimitService};

fn rules(quotas: &str) -> RuleSet {
    let text = format!(
        "domain: s\ndescriptors:\n  - key: user\n    rate_limit: {{quota: {quotas}, name: stacked}}\n  - key: team\n    rate_limit: {{quota: 5/h}}\n"
    );
    RuleSet::from_yaml(&text).unwrap()
}

const FIRST: &str = r#"["3/h", "2/day"]"#;
/// The day's quota dropped: the hour's keeps its count.
const HOUR_ONLY: &str = r#"["3/h"]"#;
/// The hour's and the day's raised (their counts carried over) and a week's added: it starts full.
const WITH_WEEK: &str = r#"["100/h", "100/day", "1/7day"]"#;

async fn engine(redis: Option<&RedisServer>, counting: Counting) -> Arc<Engine> {
    let settings = EngineSettings {
        counting,
        ..EngineSettings::default()
    };
    engine_on(redis, "stacked", rules(FIRST), settings).await
}

/// One front end: asks for user `alice` (and with `team`, a second descriptor of another
/// rule), answering whether it was admitted and what it was told is left.
trait FrontEnd {
    async fn ask(&mut self, with_team: bool) -> (bool, u64);
}

struct Rls(
    RateLimitServiceClient<tonic::transport::Channel>,
    Option<(u32, i32)>,
);

impl FrontEnd for Rls {
    async fn ask(&mut self, with_team: bool) -> (bool, u64) {
        let descriptor = |key: &str, value: &str| RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            ..Default::default()
        };
        let mut descriptors = vec![descriptor("user", "alice")];
        if with_team {
            descriptors.push(descriptor("team", "red"));
        }
        let request = RateLimitRequest {
            domain: "s".into(),
            descriptors,
            hits_addend: 0,
        };
        let response = self.0.should_rate_limit(request).await.unwrap().into_inner();
        let user = &response.statuses[0];
        self.1 = user
            .current_limit
            .as_ref()
            .map(|limit| (limit.requests_per_unit, limit.unit));
        (response.overall_code == 1, u64::from(user.limit_remaining))
    }
}

/// The check API, keeping its last answer.
struct Api(SocketAddr, serde_json::Value);

impl FrontEnd for Api {
    async fn ask(&mut self, with_team: bool) -> (bool, u64) {
        let team = if with_team {
            r#",{"entries":[{"key":"team","value":"red"}]}"#
        } else {
            ""
        };
        let body = format!(
            r#"{{"domain":"s","descriptors":[{{"entries":[{{"key":"user","value":"alice"}}]}}{team}]}}"#
        );
        let request = format!(
            "POST /v1/check HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let (status, body) = exchange(self.0, request).await;
        assert_eq!(status, 200, "{body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        let left = body["statuses"][0]["limit_remaining"].as_u64().unwrap();
        let ok = body["overall_code"] == "OK";
        self.1 = body;
        (ok, left)
    }
}

struct Layer(SocketAddr);

impl FrontEnd for Layer {
    async fn ask(&mut self, _with_team: bool) -> (bool, u64) {
        let request = "GET / HTTP/1.1\r\nhost: t\r\nx-user: alice\r\nconnection: close\r\n\r\n".to_owned();
        let (status, body) = exchange(self.0, request).await;
        assert!(status == 200 || status == 429, "{status} {body}");
        (status == 200, u64::MAX)
    }
}

/// The scenario every front end runs: 3 an hour and 2 a day.
async fn scenario(front: &mut impl FrontEnd, engine: &Engine, tells_remaining: bool) {
    let mut told = Vec::new();
    for _ in 0..4 {
        told.push(front.ask(false).await);
    }
    let admitted: Vec<bool> = told.iter().map(|(ok, _)| *ok).collect();
    // The day's quota runs out first; the hour's keeps one (the denials took nothing).
    assert_eq!(admitted, [true, true, false, false]);
    if tells_remaining {
        // The tightest answers: the day's (1 left after the first, of 2), then nothing.
        let left: Vec<u64> = told.iter().map(|(_, left)| *left).collect();
        assert_eq!(left, [1, 0, 0, 0]);
    }

    engine.reload(rules(HOUR_ONLY)).unwrap();
    assert!(
        front.ask(false).await.0,
        "the hour's quota kept one: the denials took nothing"
    );
    assert!(!front.ask(false).await.0, "the hour's quota is spent");

    engine.reload(rules(WITH_WEEK)).unwrap();
    assert!(
        front.ask(false).await.0,
        "the week's quota starts full, the others have room"
    );
    assert!(!front.ask(false).await.0, "the week's quota is spent");
}

/// RLS on an engine of its own, and the engine.
async fn serve_rls(redis: Option<&RedisServer>) -> (Rls, Arc<Engine>) {
    let engine = engine(redis, Counting::AllOrNothing).await;
    let (socket, addr) = listener().await;
    tokio::spawn(RateLimitService::new(Arc::clone(&engine)).serve(socket, std::future::pending()));
    let client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    (Rls(client, None), engine)
}

async fn every_front_end(redis: Option<&RedisServer>) {
    // RLS, with the denying quota named.
    let (mut rls, _) = serve_rls(redis).await;
    for _ in 0..3 {
        rls.ask(false).await;
    }
    assert_eq!(rls.1, Some((2, Unit::Day as i32)), "the day's quota denied");
    let (mut rls, rls_engine) = serve_rls(redis).await;
    scenario(&mut rls, &rls_engine, true).await;

    let api_engine = engine(redis, Counting::AllOrNothing).await;
    let (socket, addr) = listener().await;
    tokio::spawn(CheckApi::new(Arc::clone(&api_engine)).serve(socket, std::future::pending()));
    let mut api = Api(addr, serde_json::Value::Null);
    scenario(&mut api, &api_engine, true).await;
    // The check API lists every limit of the descriptor, in the rule's order: after the week's
    // denial, the hour's and the day's have room and the week's none.
    let limits = api.1["statuses"][0]["limits"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", api.1));
    let each: Vec<(&str, &str, u64)> = (limits.iter())
        .map(|limit| {
            let quota = limit["current_limit"]["quota"].as_str().unwrap();
            (
                limit["code"].as_str().unwrap(),
                quota,
                limit["limit_remaining"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        each,
        [
            ("OK", "100/h", 96),
            ("OK", "100/day", 97),
            ("OVER_LIMIT", "1/7day", 0)
        ],
        "{}",
        api.1
    );

    let layer_engine = engine(redis, Counting::AllOrNothing).await;
    let layer = RateLimitLayer::builder(LayerBackend::new(Arc::clone(&layer_engine), "s", "user"))
        .key([KeyPart::Header("x-user".parse().unwrap())])
        .build()
        .unwrap();
    let router = Router::new().route("/", get(|| async { "ok" })).layer(layer);
    let (socket, addr) = listener().await;
    tokio::spawn(async move { axum::serve(socket, router).await });
    scenario(&mut Layer(addr), &layer_engine, false).await;

    // Independent counting: the user's quotas stay all or nothing beside another descriptor.
    let independent = engine(redis, Counting::Independent).await;
    let (socket, addr) = listener().await;
    tokio::spawn(CheckApi::new(Arc::clone(&independent)).serve(socket, std::future::pending()));
    let mut api = Api(addr, serde_json::Value::Null);
    for _ in 0..2 {
        assert!(api.ask(true).await.0);
    }
    assert!(!api.ask(true).await.0, "the user's day is spent");
    independent.reload(rules(HOUR_ONLY)).unwrap();
    // Had the denial taken from the hour, nothing would be left of it.
    assert!(
        api.ask(false).await.0,
        "the denied request took nothing of the hour's quota"
    );
}

/// The user's rule in quota mode, then in shadow mode: its quotas are one limit, over when any
/// of them is (quota mode denies by it, as the request has no other quota-mode limit), and a
/// quota over takes nothing from the others (shadow mode counts as enforcement would).
async fn quota_and_shadow_mode(redis: Option<&RedisServer>) {
    for (mode, denies) in [("quota_mode", true), ("shadow_mode", false)] {
        let text = format!(
            "domain: s\ndescriptors:\n  - key: user\n    {mode}: true\n    rate_limit: {{quota: {FIRST}}}\n"
        );
        let settings = EngineSettings::default();
        let engine = engine_on(redis, mode, RuleSet::from_yaml(&text).unwrap(), settings).await;
        let (socket, addr) = listener().await;
        tokio::spawn(CheckApi::new(Arc::clone(&engine)).serve(socket, std::future::pending()));
        let mut api = Api(addr, serde_json::Value::Null);
        let admitted = [
            api.ask(false).await.0,
            api.ask(false).await.0,
            api.ask(false).await.0,
        ];
        assert_eq!(admitted, [true, true, !denies], "{mode}: {}", api.1);
        assert_eq!(api.1["statuses"][0]["code"], "OVER_LIMIT", "{mode}: {}", api.1);
        // The third took nothing of the hour's: with the day's dropped, one is left.
        engine
            .reload(RuleSet::from_yaml(&text.replace(FIRST, HOUR_ONLY)).unwrap())
            .unwrap();
        let left = api.ask(false).await;
        assert_eq!(left, (true, 0), "{mode}: {}", api.1);
    }
}

/// The fields name each quota of the rule apart (`stacked`, `stacked-2`), the tightest first.
async fn the_fields_name_each_quota(redis: Option<&RedisServer>) {
    let settings = EngineSettings {
        headers: FieldSet::Draft,
        ..EngineSettings::default()
    };
    let engine = engine_on(redis, "fields", rules(FIRST), settings).await;
    let (socket, addr) = listener().await;
    tokio::spawn(CheckApi::new(engine).serve(socket, std::future::pending()));
    let mut api = Api(addr, serde_json::Value::Null);
    api.ask(false).await;
    let field = |name: &str| fields::in_answer(&api.1, name);
    // The day's (1 of 2 left) is tighter than the hour's (2 of 3).
    assert_eq!(
        fields::items(&field("ratelimit-policy")),
        [
            fields::item("stacked-2", &[("q", 2), ("w", 86_400)]),
            fields::item("stacked", &[("q", 3), ("w", 3600)])
        ]
    );

    // The HTTP layer lists them too, named by the layer's policy at each quota's place.
    let engine = engine_on(redis, "fields", rules(FIRST), EngineSettings::default()).await;
    let addr = serve_layer(engine, sluice::WaitPolicy::reject()).await;
    let ask = || ask_as(addr, "bob");
    let header = |head: &str, name: &str| {
        let line = head
            .lines()
            .find(|line| line.to_ascii_lowercase().starts_with(&format!("{name}:")));
        line.unwrap_or_else(|| panic!("no {name} in {head}"))[name.len() + 1..]
            .trim()
            .to_owned()
    };
    let (status, head, _) = ask().await;
    assert_eq!(status, 200, "{head}");
    assert_eq!(
        fields::items(&header(&head, "ratelimit-policy")),
        [
            fields::item("per_user-2", &[("q", 2), ("w", 86_400)]),
            fields::item("per_user", &[("q", 3), ("w", 3600)])
        ]
    );
    let limits = fields::items(&header(&head, "ratelimit"));
    let names: Vec<&str> = limits.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["per_user-2", "per_user"]);
    assert_eq!(limits[0].1[0], ("r".to_owned(), 1));
    assert_eq!(limits[1].1[0], ("r".to_owned(), 2));
    assert_eq!(header(&head, "x-ratelimit-remaining"), "1", "the tightest's");
    // Denied by the day's: the 429 lists both, the hour's untouched.
    ask().await;
    let (status, head, _) = ask().await;
    assert_eq!(status, 429, "{head}");
    let limits = fields::items(&header(&head, "ratelimit"));
    assert_eq!(limits[0].0, "per_user-2");
    assert_eq!(
        limits[1],
        fields::item("per_user", &[("r", 1), ("t", limits[1].1[1].1)])
    );

    // A request that waits for capacity lists every quota too, once served.
    let engine = engine_on(
        redis,
        "fields",
        rules(r#"["2/s", "1000/day"]"#),
        EngineSettings::default(),
    )
    .await;
    let waits = sluice::WaitPolicy::wait_up_to(std::time::Duration::from_secs(3));
    let addr = serve_layer(engine, waits).await;
    let ask = || ask_as(addr, "carol");
    for _ in 0..2 {
        assert_eq!(ask().await.0, 200);
    }
    let (status, head, _) = ask().await;
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("server-timing: ratelimit-wait"),
        "it waited: {head}"
    );
    let names: Vec<String> = (fields::items(&header(&head, "ratelimit-policy")).into_iter())
        .map(|(name, _)| name)
        .collect();
    assert_eq!(names, ["per_user", "per_user-2"], "{head}");
}

/// The HTTP layer on `engine` (policy `per_user`, users from `x-user`, over `on_excess`),
/// served on a socket of its own.
async fn serve_layer(engine: Arc<Engine>, on_excess: sluice::WaitPolicy) -> SocketAddr {
    let layer = RateLimitLayer::builder(LayerBackend::new(engine, "s", "user"))
        .key([KeyPart::Header("x-user".parse().unwrap())])
        .policy_name("per_user")
        .on_excess(on_excess)
        .build()
        .unwrap();
    let router = Router::new().route("/", get(|| async { "ok" })).layer(layer);
    let (socket, addr) = listener().await;
    tokio::spawn(async move { axum::serve(socket, router).await });
    addr
}

/// One request as `user`: the status, the head and the body.
async fn ask_as(addr: SocketAddr, user: &str) -> (u16, String, String) {
    let request = format!("GET / HTTP/1.1\r\nhost: t\r\nx-user: {user}\r\nconnection: close\r\n\r\n");
    exchange_with_head(addr, request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory() {
    every_front_end(None).await;
    quota_and_shadow_mode(None).await;
    the_fields_name_each_quota(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let redis = RedisServer::start();
    every_front_end(Some(&redis)).await;
    quota_and_shadow_mode(Some(&redis)).await;
    the_fields_name_each_quota(Some(&redis)).await;
}
