//! Envoy's Rate Limit Quota Service: the hand-written messages against Envoy's own
//! definitions (`envoy-types`), and the service over a real socket, asked by a client built
//! from them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy::rate_limit_quota_response::bucket_action::BucketAction as TheirAction;
use envoy::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_type::rate_limit_strategy::{BlanketRule, Strategy as TheirStrategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3 as envoy;
use envoy_types::pb::envoy::r#type::v3 as envoy_type;
use prost::Message;
use sluice_descriptors::RuleSet;
use sluice_service::rlqs::{QuotaService, proto};
use sluice_service::{Engine, EngineSettings};
use tokio::sync::mpsc;
use tonic::Streaming;

/// `message` written by one definition and read by the other: the same bytes back.
fn crosses<A: Message + Default + PartialEq + std::fmt::Debug, B: Message + Default>(message: &A) -> B {
    let theirs = B::decode(message.encode_to_vec().as_slice()).unwrap();
    let back = A::decode(theirs.encode_to_vec().as_slice()).unwrap();
    assert_eq!(&back, message);
    theirs
}

fn bucket(entries: &[(&str, &str)]) -> proto::BucketId {
    proto::BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
    }
}

#[test]
fn usage_reports_read_as_envoys() {
    let reports = proto::RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: vec![
            proto::BucketQuotaUsage {
                bucket_id: Some(bucket(&[("name", "api"), ("env", "prod")])),
                time_elapsed: Some(proto::Duration {
                    seconds: 1,
                    nanos: 250_000_000,
                }),
                num_requests_allowed: 120,
                num_requests_denied: 7,
            },
            proto::BucketQuotaUsage {
                bucket_id: Some(bucket(&[("name", "other")])),
                ..Default::default()
            },
        ],
    };
    let theirs: envoy::RateLimitQuotaUsageReports = crosses(&reports);
    assert_eq!(theirs.domain, "edge");
    let first = &theirs.bucket_quota_usages[0];
    let id = first.bucket_id.as_ref().unwrap();
    assert_eq!(id.bucket.get("env").map(String::as_str), Some("prod"));
    assert_eq!((first.num_requests_allowed, first.num_requests_denied), (120, 7));
    let elapsed = first.time_elapsed.unwrap();
    assert_eq!((elapsed.seconds, elapsed.nanos), (1, 250_000_000));
    assert!(theirs.bucket_quota_usages[1].time_elapsed.is_none());
}

#[test]
fn every_action_and_strategy_reads_as_envoys() {
    let ttl = proto::Duration { seconds: 3, nanos: 0 };
    let token_bucket = proto::TokenBucket {
        max_tokens: 55,
        tokens_per_fill: Some(proto::UInt32Value { value: 55 }),
        fill_interval: Some(proto::Duration {
            seconds: 0,
            nanos: 100_000_000,
        }),
    };
    let strategies = [
        proto::RateLimitStrategy::blanket(proto::BlanketRule::AllowAll),
        proto::RateLimitStrategy::blanket(proto::BlanketRule::DenyAll),
        proto::RateLimitStrategy {
            strategy: Some(proto::Strategy::RequestsPerTimeUnit(proto::RequestsPerTimeUnit {
                requests_per_time_unit: 600,
                time_unit: 2,
            })),
        },
        proto::RateLimitStrategy {
            strategy: Some(proto::Strategy::TokenBucket(token_bucket)),
        },
    ];
    let mut actions: Vec<_> = (strategies.iter())
        .map(|strategy| proto::BucketAction::assign(bucket(&[("name", "api")]), *strategy, ttl))
        .collect();
    actions.push(proto::BucketAction::abandon(bucket(&[
        ("name", "gone"),
        ("a", "b"),
    ])));
    let response = proto::RateLimitQuotaResponse {
        bucket_action: actions,
    };
    let theirs: envoy::RateLimitQuotaResponse = crosses(&response);
    let strategy = |n: usize| match theirs.bucket_action[n].bucket_action {
        Some(TheirAction::QuotaAssignmentAction(assignment)) => {
            let live = assignment.assignment_time_to_live.unwrap();
            assert_eq!((live.seconds, live.nanos), (3, 0));
            assignment.rate_limit_strategy.unwrap().strategy.unwrap()
        }
        other => panic!("not an assignment: {other:?}"),
    };
    // ALLOW_ALL is 0, the default: it is still sent, as the oneof's field.
    assert_eq!(
        strategy(0),
        TheirStrategy::BlanketRule(BlanketRule::AllowAll as i32)
    );
    assert_eq!(
        strategy(1),
        TheirStrategy::BlanketRule(BlanketRule::DenyAll as i32)
    );
    match strategy(2) {
        TheirStrategy::RequestsPerTimeUnit(per) => {
            assert_eq!(per.requests_per_time_unit, 600);
            assert_eq!(per.time_unit, envoy_type::RateLimitUnit::Minute as i32);
        }
        other => panic!("{other:?}"),
    }
    match strategy(3) {
        TheirStrategy::TokenBucket(bucket) => {
            assert_eq!(bucket.max_tokens, 55);
            assert_eq!(bucket.tokens_per_fill.unwrap().value, 55);
            let fill = bucket.fill_interval.unwrap();
            assert_eq!((fill.seconds, fill.nanos), (0, 100_000_000));
        }
        other => panic!("{other:?}"),
    }
    let abandon = &theirs.bucket_action[4];
    assert!(matches!(
        abandon.bucket_action,
        Some(TheirAction::AbandonAction(_))
    ));
    assert_eq!(abandon.bucket_id.as_ref().unwrap().bucket.len(), 2);
}

#[test]
fn envoys_messages_read_as_ours() {
    let theirs = envoy::RateLimitQuotaUsageReports {
        domain: "d".into(),
        bucket_quota_usages: vec![envoy::rate_limit_quota_usage_reports::BucketQuotaUsage {
            bucket_id: Some(envoy::BucketId {
                bucket: [("k".to_owned(), "v".to_owned())].into_iter().collect(),
            }),
            time_elapsed: Some(envoy_types::pb::google::protobuf::Duration { seconds: 2, nanos: 0 }),
            num_requests_allowed: 5,
            num_requests_denied: 1,
        }],
    };
    let ours = proto::RateLimitQuotaUsageReports::decode(theirs.encode_to_vec().as_slice()).unwrap();
    assert_eq!(ours.encode_to_vec(), theirs.encode_to_vec());
    let usage = &ours.bucket_quota_usages[0];
    assert_eq!(usage.bucket_id, Some(bucket(&[("k", "v")])));
    assert_eq!(
        usage.time_elapsed.and_then(proto::Duration::to_std),
        Some(std::time::Duration::from_secs(2))
    );
}

const RULES: &str = r#"
domain: edge
descriptors:
  - key: name
    value: api
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: name
    value: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: name
    value: free
    rate_limit: {unlimited: true}
  - key: name
    value: watched
    rate_limit: {unit: second, requests_per_unit: 5}
    shadow_mode: true
  - key: tenant
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 600}
"#;

async fn serve(rules: &str) -> (Arc<Engine>, SocketAddr) {
    let rules = RuleSet::from_yaml(rules).unwrap();
    let engine = Arc::new(Engine::new(rules, EngineSettings::default()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(QuotaService::new(Arc::clone(&engine)).serve(listener, std::future::pending()));
    (engine, addr)
}

/// A bucket's report over a second: its id, requests allowed and denied.
type Usage<'a> = (&'a [(&'a str, &'a str)], u64, u64);

/// One data plane's stream: what it sends, and what it is sent.
struct Envoy {
    reports: mpsc::Sender<envoy::RateLimitQuotaUsageReports>,
    answers: Streaming<envoy::RateLimitQuotaResponse>,
}

impl Envoy {
    async fn open(addr: SocketAddr) -> Self {
        let mut client = RateLimitQuotaServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let (reports, to_send) = mpsc::channel(16);
        let outbound = futures_util::stream::unfold(to_send, |mut to_send| async move {
            to_send.recv().await.map(|report| (report, to_send))
        });
        let answers = client
            .stream_rate_limit_quotas(outbound)
            .await
            .unwrap()
            .into_inner();
        Self { reports, answers }
    }

    /// Sends a report of `buckets` (id, requests allowed, denied) over a second.
    async fn report(&self, domain: &str, buckets: &[Usage<'_>]) {
        let usages = buckets
            .iter()
            .map(|(id, allowed, denied)| BucketQuotaUsage {
                bucket_id: Some(their_bucket(id)),
                time_elapsed: Some(envoy_types::pb::google::protobuf::Duration { seconds: 1, nanos: 0 }),
                num_requests_allowed: *allowed,
                num_requests_denied: *denied,
            })
            .collect();
        let message = envoy::RateLimitQuotaUsageReports {
            domain: domain.into(),
            bucket_quota_usages: usages,
        };
        self.reports.send(message).await.unwrap();
    }

    /// The next message, within a few seconds.
    async fn next(&mut self) -> Result<envoy::RateLimitQuotaResponse, tonic::Status> {
        let next = tokio::time::timeout(Duration::from_secs(5), self.answers.message());
        next.await
            .expect("no answer in time")
            .map(|m| m.expect("the stream ended"))
    }

    /// The actions of the next message.
    async fn actions(&mut self) -> Vec<Got> {
        let answer = self.next().await.unwrap();
        answer.bucket_action.iter().map(Got::of).collect()
    }
}

fn their_bucket(id: &[(&str, &str)]) -> envoy::BucketId {
    envoy::BucketId {
        bucket: id
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

/// An action as the data plane reads it: the bucket, and what it is to do.
#[derive(Debug, Clone, PartialEq)]
enum Got {
    /// A token bucket: its rate per second, its size and the assignment's time to live.
    Bucket(BTreeMap<String, String>, f64, u32, Duration),
    Allow(BTreeMap<String, String>),
    Deny(BTreeMap<String, String>),
    Abandon(BTreeMap<String, String>),
}

impl Got {
    fn of(action: &envoy::rate_limit_quota_response::BucketAction) -> Self {
        let id: BTreeMap<String, String> = action
            .bucket_id
            .as_ref()
            .unwrap()
            .bucket
            .clone()
            .into_iter()
            .collect();
        let assignment = match action.bucket_action {
            Some(TheirAction::AbandonAction(_)) => return Got::Abandon(id),
            Some(TheirAction::QuotaAssignmentAction(assignment)) => assignment,
            None => panic!("no action"),
        };
        let ttl = assignment.assignment_time_to_live.unwrap();
        let ttl = Duration::new(ttl.seconds as u64, ttl.nanos as u32);
        match assignment.rate_limit_strategy.unwrap().strategy.unwrap() {
            TheirStrategy::BlanketRule(rule) if rule == BlanketRule::AllowAll as i32 => Got::Allow(id),
            TheirStrategy::BlanketRule(_) => Got::Deny(id),
            TheirStrategy::TokenBucket(bucket) => {
                let fill = bucket.fill_interval.unwrap();
                let fill = Duration::new(fill.seconds as u64, fill.nanos as u32);
                let rate = f64::from(bucket.tokens_per_fill.unwrap().value) / fill.as_secs_f64();
                Got::Bucket(id, rate, bucket.max_tokens, ttl)
            }
            other => panic!("{other:?}"),
        }
    }
}

fn id(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn rate_of(got: &Got) -> f64 {
    match got {
        Got::Bucket(_, rate, _, _) => *rate,
        other => panic!("not a token bucket: {other:?}"),
    }
}

const API: &[(&str, &str)] = &[("name", "api")];

#[tokio::test]
async fn the_first_report_gets_an_assignment() {
    let (_, addr) = serve(RULES).await;
    let mut envoy = Envoy::open(addr).await;
    envoy.report("edge", &[(API, 400, 0)]).await;
    let actions = envoy.actions().await;
    // The only client: its 400/s and all that is left, the whole 1000/s, a fill every 50 ms.
    let [Got::Bucket(bucket, rate, max_tokens, ttl)] = actions.as_slice() else {
        panic!("{actions:?}");
    };
    assert_eq!(bucket, &id(API));
    assert!((rate - 1000.0).abs() < 1e-6, "{rate}");
    assert_eq!(*max_tokens, 50);
    // Three report intervals of a second.
    assert_eq!(*ttl, Duration::from_secs(3));
    // The order of a bucket id's entries does not matter: `tenant` then `path` in the rules.
    let nested: &[(&str, &str)] = &[("tenant", "a"), ("path", "/x")];
    envoy.report("", &[(nested, 1, 0)]).await;
    let actions = envoy.actions().await;
    assert!((rate_of(&actions[0]) - 10.0).abs() < 1e-6, "{actions:?}");
}

#[tokio::test]
async fn deny_all_allow_all_and_no_rule() {
    let (_, addr) = serve(RULES).await;
    let mut envoy = Envoy::open(addr).await;
    let (blocked, free, watched, other): (&[_], &[_], &[_], &[_]) = (
        &[("name", "blocked")],
        &[("name", "free")],
        &[("name", "watched")],
        &[("name", "elsewhere")],
    );
    envoy
        .report(
            "edge",
            &[(blocked, 3, 0), (free, 3, 0), (watched, 3, 0), (other, 3, 0)],
        )
        .await;
    let actions = envoy.actions().await;
    assert_eq!(
        actions,
        [
            Got::Deny(id(blocked)),
            Got::Allow(id(free)),
            // Shadow mode: counted by nobody, enforced nowhere.
            Got::Allow(id(watched)),
            // No rule: the data plane's own no-assignment behaviour.
            Got::Abandon(id(other)),
        ]
    );
    // A domain the rules do not have: abandoned too.
    let mut elsewhere = Envoy::open(addr).await;
    elsewhere.report("nowhere", &[(API, 1, 0)]).await;
    assert_eq!(elsewhere.actions().await, [Got::Abandon(id(API))]);
}

#[tokio::test]
async fn a_bucket_whose_rule_a_reload_removes_is_abandoned() {
    let (engine, addr) = serve(RULES).await;
    let mut envoy = Envoy::open(addr).await;
    envoy.report("edge", &[(API, 10, 0)]).await;
    assert!(matches!(envoy.actions().await[..], [Got::Bucket(..)]));
    let without = RULES.replace("value: api", "value: app");
    engine.reload(RuleSet::from_yaml(&without).unwrap()).unwrap();
    envoy.report("", &[(API, 10, 0)]).await;
    assert_eq!(envoy.actions().await, [Got::Abandon(id(API))]);
}

#[tokio::test]
async fn clients_share_the_limit_and_a_newcomer_is_pushed_to_the_others() {
    let (_, addr) = serve(RULES).await;
    let mut first = Envoy::open(addr).await;
    first.report("edge", &[(API, 900, 0)]).await;
    assert!((rate_of(&first.actions().await[0]) - 1000.0).abs() < 1e-6);
    let mut second = Envoy::open(addr).await;
    second.report("edge", &[(API, 250, 50)]).await;
    // Asking 300 of 1000 between two: it gets them, the first the other 700, pushed.
    assert!((rate_of(&second.actions().await[0]) - 300.0).abs() < 1e-6);
    let pushed = first.actions().await;
    assert!((rate_of(&pushed[0]) - 700.0).abs() < 1e-6, "{pushed:?}");
}

#[tokio::test]
async fn a_malformed_report_ends_its_stream_and_no_other() {
    let (_, addr) = serve(RULES).await;
    let mut good = Envoy::open(addr).await;
    good.report("edge", &[(API, 10, 0)]).await;
    good.actions().await;
    // No domain on the first message.
    let mut nameless = Envoy::open(addr).await;
    nameless.report("", &[(API, 10, 0)]).await;
    let refused = nameless.next().await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    // An empty bucket id, after a good message.
    let mut empty = Envoy::open(addr).await;
    empty.report("edge", &[(API, 10, 0)]).await;
    empty.actions().await;
    empty.report("", &[(&[], 10, 0)]).await;
    let refused = empty.next().await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("bucket_quota_usages[0]"),
        "{refused:?}"
    );
    // A bucket id of too many entries.
    let mut wide = Envoy::open(addr).await;
    let entries: Vec<(String, String)> = (0..40).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    let entries: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    wide.report("edge", &[(&entries, 1, 0)]).await;
    assert_eq!(
        wide.next().await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    // The first stream goes on.
    good.report("", &[(API, 10, 0)]).await;
    assert!(matches!(good.actions().await[..], [Got::Bucket(..)]));
}
