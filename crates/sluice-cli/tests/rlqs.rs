//! Envoy's Rate Limit Quota Service (RLQS) in `sluice serve`, over real sockets with a client
//! built from Envoy's own definitions (`envoy-types`): with `rls.rlqs` it answers on the RLS
//! port beside RLS and gRPC health, over TLS where the port has it, on the rules file's rules;
//! every serving thread shares one set of buckets; the admin listener counts streams and
//! buckets; a stream ends when the server stops. Without `rls.rlqs` the method is
//! `UNIMPLEMENTED`.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::certs::Ca;
use common::{Client, Server, TempDir, wait_until};
use envoy::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::rate_limit_quota::v3 as envoy;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use rcgen::ExtendedKeyUsagePurpose;
use tokio::sync::mpsc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};
use tonic::{Code, Streaming};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const RULES: &str = "
domain: edge
descriptors:
  - key: name
    value: api
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: name
    value: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: name
    value: free
    rate_limit: {unlimited: true}
";

const RLQS: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";

/// `sluice serve` on [`RULES`] with `rls` as its `rls:` section, an admin listener and `more`
/// of the config.
fn start(rls: &str, more: &str, threads: &str) -> (Server, TempDir) {
    let dir = TempDir::new();
    dir.write("edge.yaml", RULES);
    let config = format!("rules: edge.yaml\nrls: {rls}\nadmin: {{listen: 127.0.0.1:0}}\n{more}");
    let file = dir.write("sluice.yaml", &config);
    let server = Server::start(&["--config", file.to_str().unwrap(), "--threads", threads]);
    (server, dir)
}

/// The clients' runtime: its connections go on while a test waits on the admin listener.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn channel(rls: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{rls}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// One data plane's stream, on a connection of its own.
struct Envoy {
    reports: mpsc::Sender<envoy::RateLimitQuotaUsageReports>,
    answers: Streaming<envoy::RateLimitQuotaResponse>,
}

impl Envoy {
    async fn open(channel: Channel) -> Result<Self, tonic::Status> {
        let (reports, to_send) = mpsc::channel(16);
        let outbound = futures_util::stream::unfold(to_send, |mut to_send| async move {
            to_send.recv().await.map(|report| (report, to_send))
        });
        let answers = RateLimitQuotaServiceClient::new(channel)
            .stream_rate_limit_quotas(outbound)
            .await?
            .into_inner();
        Ok(Self { reports, answers })
    }

    /// Reports `names` (the bucket ids `{name: NAME}`) with `requests` each over the last
    /// second.
    async fn report(&self, names: &[&str], requests: u64) {
        let usages = (names.iter())
            .map(|name| BucketQuotaUsage {
                bucket_id: Some(envoy::BucketId {
                    bucket: [("name".to_owned(), (*name).to_owned())].into(),
                }),
                time_elapsed: Some(envoy_types::pb::google::protobuf::Duration { seconds: 1, nanos: 0 }),
                num_requests_allowed: requests,
                num_requests_denied: 0,
            })
            .collect();
        let message = envoy::RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: usages,
        };
        self.reports.send(message).await.unwrap();
    }

    /// The next message; `None` when the stream ended with `OK`.
    async fn next(&mut self) -> Option<envoy::RateLimitQuotaResponse> {
        let next = tokio::time::timeout(common::PATIENCE, self.answers.message());
        next.await.expect("no message in time").unwrap()
    }

    /// The answer to a report of `names`, in their order: the next message naming as many
    /// buckets (an assignment pushed meanwhile names one).
    async fn answer(&mut self, names: &[&str]) -> Vec<Got> {
        loop {
            let message = self.next().await.expect("the stream ended");
            if message.bucket_action.len() == names.len() {
                return message.bucket_action.iter().map(Got::of).collect();
            }
        }
    }
}

/// What one bucket was told.
#[derive(Debug, Clone, PartialEq)]
enum Got {
    /// A token bucket: its tokens per fill and the fill interval.
    TokenBucket(u32, Duration),
    Blanket(BlanketRule),
    Abandon,
}

impl Got {
    fn of(action: &envoy::rate_limit_quota_response::BucketAction) -> Self {
        match action.bucket_action.as_ref().expect("an action") {
            Action::AbandonAction(_) => Self::Abandon,
            Action::QuotaAssignmentAction(assigned) => {
                let ttl = assigned.assignment_time_to_live.expect("a time to live");
                assert!(ttl.seconds > 0, "{assigned:?}");
                let strategy = assigned
                    .rate_limit_strategy
                    .as_ref()
                    .and_then(|s| s.strategy.as_ref());
                match strategy.expect("a strategy") {
                    Strategy::TokenBucket(bucket) => {
                        let fill = bucket.fill_interval.expect("a fill interval");
                        let tokens = bucket.tokens_per_fill.expect("tokens per fill").value;
                        assert_eq!(bucket.max_tokens, tokens, "{bucket:?}");
                        let fill = Duration::new(fill.seconds as u64, fill.nanos as u32);
                        Self::TokenBucket(tokens, fill)
                    }
                    Strategy::BlanketRule(rule) => Self::Blanket(BlanketRule::try_from(*rule).unwrap()),
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    /// A token bucket's rate, per second.
    fn rate(&self) -> f64 {
        match self {
            Self::TokenBucket(tokens, fill) => f64::from(*tokens) / fill.as_secs_f64(),
            other => panic!("not a token bucket: {other:?}"),
        }
    }
}

/// `ShouldRateLimit` for `{name: NAME}`: its overall code.
async fn should_rate_limit(channel: Channel, name: &str) -> i32 {
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "name".into(),
                value: name.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let answer = RateLimitServiceClient::new(channel)
        .should_rate_limit(request)
        .await
        .unwrap();
    answer.into_inner().overall_code
}

/// gRPC health's answer for `service`: its status, or the call's code.
async fn health(channel: Channel, service: &str) -> Result<ServingStatus, Code> {
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .map_err(|status| status.code())?;
    Ok(ServingStatus::try_from(answer.into_inner().status).unwrap())
}

/// A gauge's value on the admin listener's `/metrics`.
fn gauge(server: &Server, name: &str) -> Option<i64> {
    let body = Client::connect(server.admin.expect("admin.listen"))
        .get("/metrics", &[])
        .body;
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn rlqs_assigns_each_rule_on_the_rls_port_beside_rls_and_health() {
    let (server, _dir) = start("{listen: 127.0.0.1:0, rlqs: true}", "", "1");
    let rls = server.rls.expect("rls.listen");
    runtime().block_on(async {
        let mut envoy = Envoy::open(channel(rls).await).await.unwrap();
        let names = ["api", "blocked", "free", "nothing"];
        envoy.report(&names, 40).await;
        let got = envoy.answer(&names).await;
        // The only client: all of 100/s, five tokens every 50 ms.
        assert_eq!(got[0], Got::TokenBucket(5, Duration::from_millis(50)), "{got:?}");
        assert_eq!(got[1], Got::Blanket(BlanketRule::DenyAll), "{got:?}");
        assert_eq!(got[2], Got::Blanket(BlanketRule::AllowAll), "{got:?}");
        assert_eq!(got[3], Got::Abandon, "{got:?}");

        // RLS on the same port, and health for both.
        assert_eq!(should_rate_limit(channel(rls).await, "api").await, 1, "OK");
        assert_eq!(
            should_rate_limit(channel(rls).await, "blocked").await,
            2,
            "OVER_LIMIT"
        );
        assert_eq!(health(channel(rls).await, RLQS).await, Ok(ServingStatus::Serving));
        assert_eq!(
            health(channel(rls).await, "envoy.service.ratelimit.v3.RateLimitService").await,
            Ok(ServingStatus::Serving)
        );

        // The stream and the one shared bucket, on the admin listener.
        assert_eq!(gauge(&server, "sluice_rlqs_streams"), Some(1));
        assert_eq!(gauge(&server, "sluice_rlqs_buckets"), Some(1));
        drop(envoy);
        wait_until("the stream to close", || {
            gauge(&server, "sluice_rlqs_streams") == Some(0)
        });
    });
}

#[test]
fn every_serving_thread_shares_one_set_of_buckets() {
    let (server, _dir) = start("{listen: 127.0.0.1:0, rlqs: true}", "", "2");
    let rls = server.rls.expect("rls.listen");
    // Each stream on a connection of its own, which the kernel hands to either thread: all 16
    // on one thread is a chance in 2^15.
    const CLIENTS: usize = 16;
    runtime().block_on(async {
        let mut envoys = Vec::new();
        for _ in 0..CLIENTS {
            let envoy = Envoy::open(channel(rls).await).await.unwrap();
            // Each asks for all of 100/s.
            envoy.report(&["api"], 100).await;
            envoys.push(envoy);
        }
        for envoy in &mut envoys {
            envoy.answer(&["api"]).await;
        }
        assert_eq!(gauge(&server, "sluice_rlqs_streams"), Some(CLIENTS as i64));
        assert_eq!(gauge(&server, "sluice_rlqs_buckets"), Some(1));
        // Every client known to the one set of buckets: a second report is answered with its
        // equal share, 100/16 each, 100/s in all (two sets would hand out 100/s each).
        let mut total = 0.0;
        for envoy in &mut envoys {
            let names = ["api", "nothing"];
            envoy.report(&names, 100).await;
            let got = envoy.answer(&names).await;
            let rate = got[0].rate();
            assert!((rate - 100.0 / CLIENTS as f64).abs() < 0.01, "{got:?}");
            total += rate;
        }
        assert!((total - 100.0).abs() < 0.1, "{total}/s in all");
    });
}

#[test]
fn an_open_stream_ends_with_ok_when_the_server_stops() {
    // A request waiting for capacity holds the process up a while after accept stops (it is
    // in flight, so it is served first): long enough to see how the stream ended.
    let waiting = "drain_delay: 0s\non_excess: wait\nmax_wait: 10s\naccounts: {slow: 1/3s burst 1}\n";
    let (mut server, _dir) = start("{listen: 127.0.0.1:0, rlqs: true}", waiting, "2");
    let rls = server.rls.expect("rls.listen");
    let runtime = runtime();
    let mut envoy = runtime.block_on(async {
        let mut envoy = Envoy::open(channel(rls).await).await.unwrap();
        envoy.report(&["api"], 10).await;
        envoy.answer(&["api"]).await;
        envoy
    });
    assert_eq!(server.client().as_account(Some("slow")).status, 200);
    let mut waiter = server.client();
    waiter.send_as("slow");
    wait_until("the request to wait", || {
        gauge(&server, "sluice_waiting_requests") == Some(1)
    });
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    // The server ends the stream, with OK, while the waiter still waits.
    let ended = runtime.block_on(async {
        loop {
            match envoy.answers.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(()),
                Err(status) => return Err(status),
            }
        }
    });
    assert!(ended.is_ok(), "{ended:?}");
    assert_eq!(waiter.response().status, 200);
    let mut exited = None;
    wait_until("the server to exit", || {
        exited = server.child.try_wait().unwrap();
        exited.is_some()
    });
    assert!(exited.is_some_and(|status| status.success()), "{exited:?}");
}

#[test]
fn rlqs_speaks_tls_where_the_rls_port_does() {
    let dir = TempDir::new();
    let ca = Ca::new();
    let (cert, key) = ca.issue(&["localhost"], ExtendedKeyUsagePurpose::ServerAuth);
    dir.write("cert.pem", &cert);
    dir.write("key.pem", &key);
    dir.write("edge.yaml", RULES);
    let file = dir.write(
        "sluice.yaml",
        "rules: edge.yaml\nrls: {listen: 127.0.0.1:0, rlqs: true, tls: {cert: cert.pem, key: key.pem}}\n",
    );
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    let rls = server.rls.expect("rls.listen");
    runtime().block_on(async {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca.pem()))
            .domain_name("localhost");
        let channel = Channel::from_shared(format!("https://{rls}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut envoy = Envoy::open(channel).await.unwrap();
        envoy.report(&["api"], 40).await;
        let got = envoy.answer(&["api"]).await;
        assert_eq!(got[0], Got::TokenBucket(5, Duration::from_millis(50)), "{got:?}");
    });
}

#[test]
fn without_rls_rlqs_the_method_is_unimplemented_and_rls_answers() {
    let (server, _dir) = start("{listen: 127.0.0.1:0}", "", "1");
    let rls = server.rls.expect("rls.listen");
    runtime().block_on(async {
        let refused = match Envoy::open(channel(rls).await).await {
            Ok(mut envoy) => {
                // Refused when the first message is read, if not when the call is made.
                envoy.report(&["api"], 1).await;
                envoy.answers.message().await.unwrap_err()
            }
            Err(status) => status,
        };
        assert_eq!(refused.code(), Code::Unimplemented, "{refused:?}");
        assert_eq!(should_rate_limit(channel(rls).await, "api").await, 1, "OK");
        assert_eq!(health(channel(rls).await, RLQS).await, Err(Code::NotFound));
    });
    assert_eq!(gauge(&server, "sluice_rlqs_streams"), None);
}
