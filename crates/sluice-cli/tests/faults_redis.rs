//! Redis failing the way networks fail, between `sluice serve` and a real `redis-server`: too
//! slow, stalled with the connection up, reset half-way through a reply, refusing connections.
//! Under each failure policy, through each front end (the HTTP layer, RLS over gRPC, the check
//! API): every check answers within the Redis timeout plus a margin, the policy decides, `/readyz`
//! and gRPC health say what the policy means, and once Redis answers again the checks go back
//! to it by themselves.

mod common;
#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis_support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::fault::{Fault, FaultProxy};
use common::{Client, Server, TempDir, wait_until};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use redis_support::RedisServer;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The Redis timeout of every server here.
const TIMEOUT: Duration = Duration::from_millis(200);
/// The longest an answer may take under a fault: the timeout and a wide margin for a loaded
/// machine. A check that waited for Redis would take at least two `LATENCY`s, or forever.
const ANSWER_BOUND: Duration = Duration::from_millis(1500);
/// The relay's delay each way: well above the timeout.
const LATENCY: Duration = Duration::from_secs(2);

/// 4 an hour per user, shared by two servers: 2 an hour each when Redis is gone. Six checks of
/// one user tell every answer apart: Redis admits 4, fail_open 6, fail_closed none, the local
/// share 2.
const RULES: &str = "
domain: edge
descriptors:
  - key: user
    rate_limit: {quota: 4/h}
";

fn config(policy: &str) -> String {
    format!(
        "
rules: edge.yaml
rls: {{listen: 127.0.0.1:0}}
api: {{listen: 127.0.0.1:0}}
admin: {{listen: 127.0.0.1:0}}
fetch_latency: 0s
failsafe: 4/h
unknown: 4/h
accounts: {{}}
bypass: []
redis:
  policy: {policy}
  hosts: 2
  timeout: {}ms
  degrade_after: 2
",
        TIMEOUT.as_millis()
    )
}

/// The three front ends of one server, and what each answers for one user.
struct FrontEnds<'a> {
    server: &'a Server,
    runtime: tokio::runtime::Runtime,
    rls: RateLimitServiceClient<Channel>,
    health: HealthClient<Channel>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Front {
    Http,
    Rls,
    Api,
}

impl<'a> FrontEnds<'a> {
    fn new(server: &'a Server) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let rls = server.rls.expect("rls.listen");
        let channel = runtime.block_on(async {
            Channel::from_shared(format!("http://{rls}"))
                .unwrap()
                .connect()
                .await
                .unwrap()
        });
        Self {
            server,
            rls: RateLimitServiceClient::new(channel.clone()),
            health: HealthClient::new(channel),
            runtime,
        }
    }

    /// One check of `user` through `front`: admitted or not, and how long the answer took.
    fn check(&mut self, front: Front, user: &str) -> (bool, Duration) {
        let start = Instant::now();
        let admitted = match front {
            Front::Http => {
                let response = self.server.client().as_account(Some(user));
                assert!(matches!(response.status, 200 | 429), "HTTP answered {response:?}");
                response.status == 200
            }
            Front::Rls => {
                let request = RateLimitRequest {
                    domain: "edge".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "user".into(),
                            value: user.into(),
                        }],
                        ..Default::default()
                    }],
                    hits_addend: 0,
                };
                let answer = self
                    .runtime
                    .block_on(self.rls.should_rate_limit(request))
                    .unwrap_or_else(|status| panic!("RLS answered {status:?}"))
                    .into_inner();
                answer.overall_code == 1
            }
            Front::Api => {
                let api = self.server.api.expect("api.listen");
                let body = format!(
                    r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
                );
                let response = Client::connect(api).post_json("/v1/check", &body);
                assert_eq!(response.status, 200, "check API answered {response:?}");
                let verdict: serde_json::Value = serde_json::from_str(&response.body).unwrap();
                verdict["overall_code"] == "OK"
            }
        };
        (admitted, start.elapsed())
    }

    /// `/readyz`: ready or not, and how long the answer took.
    fn readyz(&self) -> (bool, Duration) {
        let start = Instant::now();
        let response = Client::connect(self.server.admin.expect("admin.listen")).get("/readyz", &[]);
        assert!(matches!(response.status, 200 | 503), "{response:?}");
        (response.status == 200, start.elapsed())
    }

    fn grpc_serving(&mut self) -> bool {
        let request = HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        };
        let answer = self
            .runtime
            .block_on(self.health.check(request))
            .unwrap()
            .into_inner();
        answer.status == ServingStatus::Serving as i32
    }
}

fn redis_addr(redis: &RedisServer) -> SocketAddr {
    redis.url().strip_prefix("redis://").unwrap().parse().unwrap()
}

/// What `policy` answers for six checks of a new user while Redis does not answer.
fn expected(policy: &str) -> Vec<bool> {
    match policy {
        "fail_open" => vec![true; 6],
        "fail_closed" => vec![false; 6],
        // The local share: 4/h over 2 hosts.
        "local_share" => vec![true, true, false, false, false, false],
        other => unreachable!("{other}"),
    }
}

fn faults_under(policy: &str) {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis_addr(&redis));
    let dir = TempDir::new();
    dir.write("edge.yaml", RULES);
    let file = dir.write("sluice.yaml", &config(policy));
    let server = Server::start(&["--config", file.to_str().unwrap(), "--redis", &proxy.redis_url()]);
    let mut fronts = FrontEnds::new(&server);
    let all = [Front::Http, Front::Rls, Front::Api];

    // Healthy: the counts are on Redis.
    for front in all {
        let user = format!("healthy-{front:?}");
        let admitted: Vec<bool> = (0..6).map(|_| fronts.check(front, &user).0).collect();
        assert_eq!(admitted, [true, true, true, true, false, false], "{front:?}");
    }
    assert_ne!(redis.cli(&["DBSIZE"]).trim(), "0");
    assert!(fronts.readyz().0);
    assert!(fronts.grpc_serving());

    let faults = [
        Fault::Latency(LATENCY),
        Fault::Stall,
        Fault::ResetMidReply,
        Fault::Refuse,
    ];
    for (round, fault) in faults.into_iter().enumerate() {
        proxy.set(fault);
        for front in all {
            let user = format!("{fault:?}-{front:?}");
            let answers: Vec<(bool, Duration)> = (0..6).map(|_| fronts.check(front, &user)).collect();
            let slowest = answers.iter().map(|(_, took)| *took).max().unwrap();
            assert!(
                slowest < ANSWER_BOUND,
                "{policy}, {fault:?}, {front:?}: an answer took {slowest:?}"
            );
            let admitted: Vec<bool> = answers.iter().map(|(admitted, _)| *admitted).collect();
            assert_eq!(admitted, expected(policy), "{policy}, {fault:?}, {front:?}");
        }
        // Readiness says what the policy means: only fail_closed turns everyone away.
        let (ready, took) = fronts.readyz();
        assert!(took < ANSWER_BOUND, "{policy}, {fault:?}: /readyz took {took:?}");
        assert_eq!(ready, policy != "fail_closed", "{policy}, {fault:?}: /readyz");
        if policy == "fail_closed" {
            wait_until("gRPC health says NOT_SERVING", || !fronts.grpc_serving());
        } else {
            assert!(fronts.grpc_serving(), "{policy}, {fault:?}: gRPC health");
        }

        // Redis answers again: each front end's checks go back to it unaided.
        proxy.set(Fault::None);
        redis.cli(&["FLUSHALL"]);
        for front in all {
            let mut tries = 0;
            wait_until(
                &format!("{policy}: {front:?} back on Redis after {fault:?}"),
                || {
                    tries += 1;
                    let user = format!("back-{round}-{front:?}-{tries}");
                    let (admitted, _) = fronts.check(front, &user);
                    admitted && redis.cli(&["KEYS", &format!("*{user}*")]).trim() != ""
                },
            );
        }
        wait_until("/readyz ready again", || fronts.readyz().0);
        wait_until("gRPC health SERVING again", || fronts.grpc_serving());
    }
}

#[test]
fn under_fail_open_a_failing_redis_admits_within_the_timeout_and_is_left_when_it_answers() {
    faults_under("fail_open");
}

#[test]
fn under_fail_closed_a_failing_redis_denies_within_the_timeout_and_is_left_when_it_answers() {
    faults_under("fail_closed");
}

#[test]
fn under_local_share_a_failing_redis_gives_each_host_its_share_and_is_left_when_it_answers() {
    faults_under("local_share");
}
