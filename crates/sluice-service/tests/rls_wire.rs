//! Envoy's RLS v3 over a real socket, asked by a client built from Envoy's own message
//! definitions (`envoy-types`): every status is what the rules say.

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice_descriptors::RuleSet;
use sluice_service::{Counting, Engine, EngineSettings, FieldSet, RateLimitService};
use tonic::transport::Channel;

mod fields;
use fields::{item, items};

const RULES: &str = r#"
domain: edge
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 3, name: users_db}
  - key: database
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: client
    descriptors:
      - key: path
        value: "/api/*"
        rate_limit: {unit: hour, requests_per_unit: 2, name: api}
  - key: shadowed
    rate_limit: {unit: minute, requests_per_unit: 1}
    shadow_mode: true
  - key: generic_key
    value: free
    rate_limit: {unlimited: true}
  - key: bulk
    rate_limit: {unit: minute, requests_per_unit: 10}
"#;

async fn serve(counting: Counting) -> RateLimitServiceClient<Channel> {
    let rules = RuleSet::from_yaml(RULES).unwrap();
    let settings = EngineSettings {
        counting,
        headers: FieldSet::All,
        ..EngineSettings::default()
    };
    let engine = Arc::new(Engine::new(rules, settings).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(RateLimitService::new(engine).serve(listener, std::future::pending()));
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).into(),
                value: (*value).into(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    }
}

async fn ask(client: &mut RateLimitServiceClient<Channel>, request: RateLimitRequest) -> RateLimitResponse {
    client.should_rate_limit(request).await.unwrap().into_inner()
}

/// (code, remaining) of each status.
fn codes(response: &RateLimitResponse) -> Vec<(Code, u32)> {
    response
        .statuses
        .iter()
        .map(|s| (Code::try_from(s.code).unwrap(), s.limit_remaining))
        .collect()
}

#[tokio::test]
async fn an_exact_value_comes_before_the_key_only_default() {
    let mut client = serve(Counting::AllOrNothing).await;
    let users = || request(vec![descriptor(&[("database", "users")])]);
    for left in [2, 1, 0] {
        let response = ask(&mut client, users()).await;
        assert_eq!(codes(&response), [(Code::Ok, left)]);
        let limit = response.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit, limit.name.as_str()),
            (3, Unit::Second as i32, "users_db")
        );
    }
    let response = ask(&mut client, users()).await;
    assert_eq!(response.overall_code, Code::OverLimit as i32);
    assert_eq!(codes(&response), [(Code::OverLimit, 0)]);
    // Another database falls to the key-only rule: 1 per second, its own counter.
    let other = ask(&mut client, request(vec![descriptor(&[("database", "orders")])])).await;
    assert_eq!(codes(&other), [(Code::Ok, 0)]);
    let reset = other.statuses[0].duration_until_reset.unwrap();
    assert!(reset.seconds <= 1, "{reset:?}");
}

#[tokio::test]
async fn a_key_only_rule_counts_each_value_apart() {
    let mut client = serve(Counting::AllOrNothing).await;
    for ip in 0..50 {
        let value = format!("10.0.0.{ip}");
        for expected in [(Code::Ok, 1), (Code::Ok, 0), (Code::OverLimit, 0)] {
            let response = ask(
                &mut client,
                request(vec![descriptor(&[("remote_address", &value)])]),
            )
            .await;
            assert_eq!(codes(&response), [expected], "{value}");
        }
    }
}

#[tokio::test]
async fn nested_descriptors_and_a_prefix_match() {
    let mut client = serve(Counting::AllOrNothing).await;
    let api = |path: &str| request(vec![descriptor(&[("client", "web"), ("path", path)])]);
    assert_eq!(codes(&ask(&mut client, api("/api/users")).await), [(Code::Ok, 1)]);
    assert_eq!(codes(&ask(&mut client, api("/api/users")).await), [(Code::Ok, 0)]);
    assert_eq!(
        codes(&ask(&mut client, api("/api/users")).await),
        [(Code::OverLimit, 0)]
    );
    // Another path under the prefix has its own counter; one outside it has no rule.
    assert_eq!(
        codes(&ask(&mut client, api("/api/orders")).await),
        [(Code::Ok, 1)]
    );
    let outside = ask(&mut client, api("/static/app.js")).await;
    assert_eq!(outside.overall_code, Code::Ok as i32);
    assert!(outside.statuses[0].current_limit.is_none());
    // The parent alone has no limit.
    let parent = ask(&mut client, request(vec![descriptor(&[("client", "web")])])).await;
    assert!(parent.statuses[0].current_limit.is_none());
}

#[tokio::test]
async fn shadow_mode_counts_and_reports_but_admits() {
    let mut client = serve(Counting::AllOrNothing).await;
    let shadowed = || request(vec![descriptor(&[("shadowed", "x")])]);
    let first = ask(&mut client, shadowed()).await;
    assert_eq!(
        (first.overall_code, codes(&first)),
        (Code::Ok as i32, vec![(Code::Ok, 0)])
    );
    let second = ask(&mut client, shadowed()).await;
    assert_eq!(second.overall_code, Code::Ok as i32, "shadow mode never denies");
    assert_eq!(
        codes(&second),
        [(Code::OverLimit, 0)],
        "and still says it is over"
    );
    assert!(
        second
            .response_headers_to_add
            .iter()
            .all(|h| h.key != "retry-after")
    );
}

#[tokio::test]
async fn unlimited_and_unknown_domains_and_descriptors_are_ok_without_a_limit() {
    let mut client = serve(Counting::AllOrNothing).await;
    for _ in 0..100 {
        let free = ask(&mut client, request(vec![descriptor(&[("generic_key", "free")])])).await;
        assert_eq!(free.overall_code, Code::Ok as i32);
        assert!(free.statuses[0].current_limit.is_none());
    }
    let unknown_key = ask(&mut client, request(vec![descriptor(&[("nobody", "x")])])).await;
    assert_eq!(unknown_key.overall_code, Code::Ok as i32);
    let mut elsewhere = request(vec![descriptor(&[("database", "users")])]);
    elsewhere.domain = "elsewhere".into();
    let unknown_domain = ask(&mut client, elsewhere).await;
    assert_eq!(unknown_domain.overall_code, Code::Ok as i32);
    assert!(unknown_domain.statuses[0].current_limit.is_none());
}

#[tokio::test]
async fn hits_addend_on_the_request_and_per_descriptor() {
    let mut client = serve(Counting::AllOrNothing).await;
    let mut seven = request(vec![descriptor(&[("bulk", "a")])]);
    seven.hits_addend = 7;
    assert_eq!(codes(&ask(&mut client, seven).await), [(Code::Ok, 3)]);
    let mut four = descriptor(&[("bulk", "a")]);
    four.hits_addend = Some(UInt64Value { value: 4 });
    let mut request_says_one = request(vec![four]);
    request_says_one.hits_addend = 1;
    // The descriptor's 4 wins over the request's 1: over the 3 left, and nothing taken.
    assert_eq!(
        codes(&ask(&mut client, request_says_one).await),
        [(Code::OverLimit, 3)]
    );
    let mut three = request(vec![descriptor(&[("bulk", "a")])]);
    three.hits_addend = 3;
    assert_eq!(codes(&ask(&mut client, three).await), [(Code::Ok, 0)]);
}

#[tokio::test]
async fn a_request_denied_by_its_second_descriptor_consumes_nothing_from_its_first() {
    let mut client = serve(Counting::AllOrNothing).await;
    // Spend database=orders (1/s).
    assert_eq!(
        codes(&ask(&mut client, request(vec![descriptor(&[("database", "orders")])])).await),
        [(Code::Ok, 0)]
    );
    let both = || {
        request(vec![
            descriptor(&[("remote_address", "192.0.2.1")]),
            descriptor(&[("database", "orders")]),
        ])
    };
    for _ in 0..5 {
        let response = ask(&mut client, both()).await;
        assert_eq!(response.overall_code, Code::OverLimit as i32);
        assert_eq!(codes(&response), [(Code::Ok, 2), (Code::OverLimit, 0)]);
    }
    // The address's 2 per minute are all still there.
    let alone = request(vec![descriptor(&[("remote_address", "192.0.2.1")])]);
    assert_eq!(codes(&ask(&mut client, alone.clone()).await), [(Code::Ok, 1)]);
    assert_eq!(codes(&ask(&mut client, alone).await), [(Code::Ok, 0)]);
}

#[tokio::test]
async fn independent_counting_spends_the_first_descriptor_as_envoys_service_does() {
    let mut client = serve(Counting::Independent).await;
    assert_eq!(
        codes(&ask(&mut client, request(vec![descriptor(&[("database", "orders")])])).await),
        [(Code::Ok, 0)]
    );
    let both = request(vec![
        descriptor(&[("remote_address", "192.0.2.1")]),
        descriptor(&[("database", "orders")]),
    ]);
    assert_eq!(
        codes(&ask(&mut client, both).await),
        [(Code::Ok, 1), (Code::OverLimit, 0)]
    );
}

#[tokio::test]
async fn a_limit_override_sets_the_quota() {
    let mut client = serve(Counting::AllOrNothing).await;
    let mut overridden = descriptor(&[("remote_address", "198.51.100.1")]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 5,
        unit: Unit::Hour as i32,
    });
    let response = ask(&mut client, request(vec![overridden])).await;
    assert_eq!(codes(&response), [(Code::Ok, 4)]);
    let limit = response.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (5, Unit::Hour as i32));
}

#[tokio::test]
async fn denials_carry_the_rate_limit_headers() {
    let mut client = serve(Counting::AllOrNothing).await;
    let users = || request(vec![descriptor(&[("database", "users")])]);
    for _ in 0..3 {
        ask(&mut client, users()).await;
    }
    let denied = ask(&mut client, users()).await;
    let header = |name: &str| {
        denied
            .response_headers_to_add
            .iter()
            .find(|h| h.key == name)
            .map(|h| h.value.clone())
    };
    assert_eq!(
        header("ratelimit-policy").as_deref(),
        Some("\"users_db\";q=3;w=1")
    );
    assert_eq!(header("x-ratelimit-remaining").as_deref(), Some("0"));
    assert_eq!(header("retry-after").as_deref(), Some("1"));
}

fn header(response: &RateLimitResponse, name: &str) -> Option<String> {
    (response.response_headers_to_add.iter())
        .find(|h| h.key == name)
        .map(|h| h.value.clone())
}

/// Several limits counted: `RateLimit-Policy` and `RateLimit` name every one, the most
/// restrictive first (a shadow rule's is not one); `X-RateLimit-*` and `Retry-After` speak
/// for the most restrictive alone.
#[tokio::test]
async fn the_fields_list_every_limit_counted() {
    let mut client = serve(Counting::AllOrNothing).await;
    let three = || {
        request(vec![
            descriptor(&[("database", "users")]),
            descriptor(&[("client", "c"), ("path", "/api/x")]),
            descriptor(&[("shadowed", "s")]),
        ])
    };
    let first = ask(&mut client, three()).await;
    let policies = items(&header(&first, "ratelimit-policy").unwrap());
    // api has 1 of 2 left, users_db 2 of 3: api is the more restrictive.
    assert_eq!(
        policies,
        [
            item("api", &[("q", 2), ("w", 3600)]),
            item("users_db", &[("q", 3), ("w", 1)])
        ]
    );
    let remaining: Vec<(String, i64)> = items(&header(&first, "ratelimit").unwrap())
        .into_iter()
        .map(|(name, params)| {
            assert_eq!(params[0].0, "r");
            assert_eq!(params[1].0, "t");
            (name, params[0].1)
        })
        .collect();
    assert_eq!(remaining, [("api".to_owned(), 1), ("users_db".to_owned(), 2)]);
    assert_eq!(header(&first, "x-ratelimit-remaining").as_deref(), Some("1"));
    assert_eq!(header(&first, "x-ratelimit-limit").as_deref(), Some("2"));

    ask(&mut client, three()).await;
    let denied = ask(&mut client, three()).await;
    assert_eq!(denied.overall_code, Code::OverLimit as i32);
    let items_now = items(&header(&denied, "ratelimit").unwrap());
    let names: Vec<&str> = items_now.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["api", "users_db"], "the denying limit first");
    assert_eq!(items_now[0].1[0], ("r".to_owned(), 0));
    // All or nothing: the denied request took nothing of users_db (3 a second, 2 taken).
    assert_eq!(items_now[1].1[0], ("r".to_owned(), 1));
    let retry: u64 = header(&denied, "retry-after").unwrap().parse().unwrap();
    assert!(retry > 1, "api's hour, not users_db's second: {retry}");
}

#[tokio::test]
async fn oversize_and_malformed_requests_are_invalid_arguments() {
    let mut client = serve(Counting::AllOrNothing).await;
    let many = request((0..65).map(|i| descriptor(&[("bulk", &i.to_string())])).collect());
    let status = client.should_rate_limit(many).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("65 descriptors, at most 64"),
        "{}",
        status.message()
    );

    let long = "v".repeat(1025);
    let status = client
        .should_rate_limit(request(vec![descriptor(&[("bulk", &long)])]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("descriptors[0].entries[0].value"),
        "{}",
        status.message()
    );

    let wide = request(vec![descriptor(&vec![("k", "v"); 17])]);
    assert_eq!(
        client.should_rate_limit(wide).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    let empty = request(vec![descriptor(&[])]);
    assert_eq!(
        client.should_rate_limit(empty).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    let none = request(vec![]);
    assert_eq!(
        client.should_rate_limit(none).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );

    // A message past the size bound is refused before it is decoded.
    let huge = request(vec![descriptor(&[("bulk", &"x".repeat(300 * 1024))])]);
    let status = client.should_rate_limit(huge).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");

    // The server still answers.
    assert_eq!(
        ask(&mut client, request(vec![descriptor(&[("bulk", "ok")])]))
            .await
            .overall_code,
        Code::Ok as i32
    );
}

/// A request whose message is `len` bytes: one descriptor, its value padded.
fn request_of_len(len: usize) -> RateLimitRequest {
    use prost::Message;
    let mut value = "x".repeat(len);
    loop {
        let sized = request(vec![descriptor(&[("bulk", &value)])]);
        match sized.encoded_len().cmp(&len) {
            std::cmp::Ordering::Equal => return sized,
            std::cmp::Ordering::Greater => value.pop(),
            std::cmp::Ordering::Less => unreachable!("{len}: {}", sized.encoded_len()),
        };
    }
}

#[tokio::test]
async fn a_message_over_the_size_limit_is_resource_exhausted_and_one_at_it_is_read() {
    let mut client = serve(Counting::AllOrNothing)
        .await
        .max_encoding_message_size(usize::MAX);
    // At the limit: decoded, and refused only for its over-long value.
    let at = request_of_len(sluice_service::MAX_MESSAGE_BYTES);
    let status = client.should_rate_limit(at).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("descriptors[0].entries[0].value"),
        "{status:?}"
    );

    // One byte over: RESOURCE_EXHAUSTED, as gRPC's status codes say, naming both sizes.
    let over = request_of_len(sluice_service::MAX_MESSAGE_BYTES + 1);
    let status = client.should_rate_limit(over).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let (found, limit) = (
        (sluice_service::MAX_MESSAGE_BYTES + 1).to_string(),
        sluice_service::MAX_MESSAGE_BYTES.to_string(),
    );
    assert!(
        status.message().contains(&found) && status.message().contains(&limit),
        "{status:?}"
    );

    // The connection still serves.
    let fine = ask(&mut client, request(vec![descriptor(&[("bulk", "ok")])])).await;
    assert_eq!(fine.overall_code, Code::Ok as i32);
}

#[tokio::test]
async fn the_health_service_says_serving() {
    let rules = RuleSet::from_yaml(RULES).unwrap();
    let engine = Arc::new(Engine::new(rules, EngineSettings::default()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(RateLimitService::new(engine).serve(listener, std::future::pending()));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test]
async fn the_health_service_follows_the_hosts_readiness() {
    let rules = RuleSet::from_yaml(RULES).unwrap();
    let engine = Arc::new(Engine::new(rules, EngineSettings::default()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ready, readiness) = tokio::sync::watch::channel(true);
    let service = RateLimitService::new(engine).reporting(readiness);
    tokio::spawn(service.serve(listener, std::future::pending()));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = async |health: &mut tonic_health::pb::health_client::HealthClient<Channel>,
                        service: &str| {
        health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status
    };
    use tonic_health::pb::health_check_response::ServingStatus;
    let named = "envoy.service.ratelimit.v3.RateLimitService";
    for (now, expected) in [(false, ServingStatus::NotServing), (true, ServingStatus::Serving)] {
        ready.send_replace(now);
        let mut tries = 0;
        while status(&mut health, named).await != expected as i32
            || status(&mut health, "").await != expected as i32
        {
            tries += 1;
            assert!(tries < 500, "the health service never said {expected:?}");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}
