//! Two `sluice serve` processes on one real `redis-server`, raced over RLS (gRPC) on one key:
//! several clients on each server at once, not taking turns. However the calls interleave in
//! Redis, the admitted total is exactly the limit.

mod common;
#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis_support;

use std::sync::Arc;

use common::{Server, TempDir};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use redis_support::RedisServer;
use tonic::transport::Channel;

/// A day-long quota: nothing refills during the test, so exactly `LIMIT` may pass.
const LIMIT: u64 = 1000;
/// Clients on each server, each sending `CALLS` checks as fast as answers come.
const CLIENTS_PER_SERVER: usize = 4;
const CALLS: usize = 400;

fn config(algorithm: &str) -> String {
    format!(
        "
algorithm: {algorithm}
rules: edge.yaml
rls: {{listen: 127.0.0.1:0}}
redis:
  policy: fail_closed
  timeout: 2s
"
    )
}

async fn race(rls: std::net::SocketAddr, start: Arc<tokio::sync::Barrier>) -> u64 {
    let channel = Channel::from_shared(format!("http://{rls}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "contended".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    start.wait().await;
    let mut admitted = 0;
    for _ in 0..CALLS {
        let answer = client
            .should_rate_limit(request.clone())
            .await
            .unwrap()
            .into_inner();
        match answer.overall_code {
            1 => admitted += 1,
            2 => {}
            other => panic!("overall_code {other}"),
        }
    }
    admitted
}

#[test]
fn two_servers_raced_over_rls_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    for algorithm in [
        "token_bucket",
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
    ] {
        redis.cli(&["FLUSHALL"]);
        let dir = TempDir::new();
        dir.write(
            "edge.yaml",
            &format!("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {{quota: {LIMIT}/day}}\n"),
        );
        let file = dir.write("sluice.yaml", &config(algorithm));
        let file = file.to_str().unwrap();
        let servers = [
            Server::start(&["--config", file, "--redis", &redis.url()]),
            Server::start(&["--config", file, "--redis", &redis.url()]),
        ];
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let per_server: Vec<u64> = runtime.block_on(async {
            let start = Arc::new(tokio::sync::Barrier::new(2 * CLIENTS_PER_SERVER));
            let mut tasks = Vec::new();
            for server in &servers {
                for _ in 0..CLIENTS_PER_SERVER {
                    let rls = server.rls.expect("rls.listen");
                    tasks.push(tokio::spawn(race(rls, Arc::clone(&start))));
                }
            }
            let mut admitted = vec![0; 2];
            for (i, task) in tasks.into_iter().enumerate() {
                admitted[i / CLIENTS_PER_SERVER] += task.await.unwrap();
            }
            admitted
        });
        let total: u64 = per_server.iter().sum();
        assert_eq!(total, LIMIT, "{algorithm}: admitted {per_server:?}");
        // Both servers took part in the race.
        assert!(per_server.iter().all(|&n| n > 0), "{algorithm}: {per_server:?}");
    }
}
