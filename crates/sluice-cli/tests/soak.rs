//! The soak (`scripts/soak.sh MINUTES`; ignored by the suite): `sluice serve` with the HTTP
//! demo, RLS, the check API and an admin listener, its rules polled from a real `sluice rules`
//! and its counters on a real `redis-server`, under mixed load for `SLUICE_SOAK_MINUTES`:
//! hot keys, a flood of new keys, a rules change every few seconds, Redis restarted every five
//! minutes and the rules service every seven. Each minute it samples the server's RSS, open
//! files and threads and the load's p99 latency; it fails when a request errors or when any of
//! them keeps growing.

mod common;
#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fault::FaultProxy;
use common::{Client, RulesService, Server, TempDir, wait_until};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use redis_support::RedisServer;
use tonic::transport::Channel;

const WRITER: &str = "Bearer writer-0123456789abcdef";
const READER: &str = "reader-0123456789abcdef";

fn rules(per_minute: u64) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {{quota: {per_minute}/min}}\n  - key: path\n    value: /login\n    rate_limit: {{quota: 100/s}}\n"
    )
}

/// One minute of the load's answers.
#[derive(Default)]
struct Minute {
    latencies_us: Vec<u64>,
    errors: Vec<String>,
}

struct Load {
    minute: Mutex<Minute>,
    stop: AtomicBool,
    sent: AtomicU64,
}

impl Load {
    fn record(&self, took: Duration, error: Option<String>) {
        let mut minute = self.minute.lock().unwrap();
        minute
            .latencies_us
            .push(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
        if let Some(error) = error {
            minute.errors.push(error);
        }
        self.sent.fetch_add(1, Ordering::Relaxed);
    }
}

/// A key: one of 20 hot ones most of the time, else one never seen before.
fn key(n: u64) -> String {
    if n.is_multiple_of(4) {
        format!("new-{n}")
    } else {
        format!("hot-{}", n % 20)
    }
}

fn http_load(server_addr: std::net::SocketAddr, load: &Load) {
    let mut client = Client::connect(server_addr);
    let mut n = 0u64;
    while !load.stop.load(Ordering::Relaxed) {
        n += 1;
        let start = Instant::now();
        let response = client.as_account(Some(&format!("{}@example.com", key(n))));
        let error = (!matches!(response.status, 200 | 429)).then(|| format!("HTTP {response:?}"));
        load.record(start.elapsed(), error);
    }
}

fn api_load(api: std::net::SocketAddr, load: &Load) {
    let mut client = Client::connect(api);
    let mut n = 0u64;
    while !load.stop.load(Ordering::Relaxed) {
        n += 1;
        let body = format!(
            r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{}"}}]}},{{"entries":[{{"key":"path","value":"/login"}}]}}]}}"#,
            key(n)
        );
        let start = Instant::now();
        let response = client.post_json("/v1/check", &body);
        let error = (response.status != 200).then(|| format!("check API {response:?}"));
        load.record(start.elapsed(), error);
    }
}

async fn rls_load(rls: std::net::SocketAddr, load: Arc<Load>) {
    let channel = Channel::from_shared(format!("http://{rls}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    let mut n = 0u64;
    while !load.stop.load(Ordering::Relaxed) {
        n += 1;
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: key(n),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let start = Instant::now();
        let error = match client.should_rate_limit(request).await {
            Ok(answer) if matches!(answer.get_ref().overall_code, 1 | 2) => None,
            Ok(answer) => Some(format!("RLS overall_code {}", answer.get_ref().overall_code)),
            Err(status) => Some(format!("RLS {status:?}")),
        };
        load.record(start.elapsed(), error);
    }
}

/// The server's resident memory (KiB), open files and threads, from /proc.
fn resources(pid: u32) -> (u64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        (status.lines())
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    let files = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count() as u64;
    (field("VmRSS:"), files, field("Threads:"))
}

fn p99(latencies: &mut [u64]) -> u64 {
    if latencies.is_empty() {
        return 0;
    }
    latencies.sort_unstable();
    latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)]
}

/// A rules service in `dir` (its database survives a restart), behind `proxy`.
fn rules_service(dir: &TempDir) -> RulesService {
    RulesService::start(dir, &["--tokens", "tokens"])
}

#[test]
#[ignore = "a soak of minutes: scripts/soak.sh MINUTES"]
fn soak() {
    let minutes: u64 = std::env::var("SLUICE_SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(2);
    let mut redis = RedisServer::start();
    let store = TempDir::new();
    store.write(
        "tokens",
        &format!("writer write writer-0123456789abcdef\nhosts read {READER}\n"),
    );
    let mut service = rules_service(&store);
    let rules_proxy = FaultProxy::start(service.addr);
    let mut api = Client::connect(service.addr);
    let created = api.send(
        "PUT",
        "/v1/domains/edge",
        &[("authorization", WRITER), ("if-none-match", "*")],
        &rules(600),
    );
    assert_eq!(created.status, 201, "{created:?}");
    let mut etag = created.header("etag").unwrap().to_owned();

    let dir = TempDir::new();
    let config = dir.write(
        "sluice.yaml",
        &format!(
            "
rules: {{url: \"{}\", poll: 1s, token: {READER}, snapshot: rules.json}}
rls: {{listen: 127.0.0.1:0}}
api: {{listen: 127.0.0.1:0}}
admin: {{listen: 127.0.0.1:0}}
capacity: 10000
fetch_latency: 0s
unknown: 600/min
denied_log: 1
redis:
  policy: local_share
  hosts: 2
  timeout: 50ms
",
            rules_proxy.http_url()
        ),
    );
    let server = Server::start(&[
        "--config",
        config.to_str().unwrap(),
        "--redis",
        &redis.url(),
        "--threads",
        "2",
    ]);
    let pid = server.child.id();
    wait_until("the first rules", || {
        server.stderr().contains("rules fetched from the rules service")
    });

    let load = Arc::new(Load {
        minute: Mutex::new(Minute::default()),
        stop: AtomicBool::new(false),
        sent: AtomicU64::new(0),
    });
    let mut threads = Vec::new();
    for _ in 0..2 {
        let (load, addr) = (Arc::clone(&load), server.addr);
        threads.push(std::thread::spawn(move || http_load(addr, &load)));
    }
    let (load_api, api_addr) = (Arc::clone(&load), server.api.unwrap());
    threads.push(std::thread::spawn(move || api_load(api_addr, &load_api)));
    let (load_rls, rls_addr) = (Arc::clone(&load), server.rls.unwrap());
    threads.push(std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(rls_load(rls_addr, load_rls));
    }));

    println!("minute,rss_kib,open_files,threads,p99_us,requests,errors");
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut per_minute = 600;
    let (mut next_change, mut redis_restarts, mut rules_restarts) = (Duration::from_secs(3), 0, 0);
    for minute in 1..=minutes {
        let end = Duration::from_secs(60 * minute);
        while start.elapsed() < end {
            let now = start.elapsed();
            // A rules change every 3 s: the quota alternates.
            if now >= next_change {
                per_minute = if per_minute == 600 { 300 } else { 600 };
                let changed = api.send(
                    "PUT",
                    "/v1/domains/edge",
                    &[("authorization", WRITER), ("if-match", &etag)],
                    &rules(per_minute),
                );
                assert_eq!(changed.status, 200, "{changed:?}");
                etag = changed.header("etag").unwrap().to_owned();
                next_change = now + Duration::from_secs(3);
            }
            if now >= Duration::from_secs(300 * (redis_restarts + 1)) {
                redis.restart();
                redis_restarts += 1;
            }
            if now >= Duration::from_secs(420 * (rules_restarts + 1)) {
                drop(service);
                std::thread::sleep(Duration::from_secs(2));
                service = rules_service(&store);
                rules_proxy.set_upstream(service.addr);
                api = Client::connect(service.addr);
                rules_restarts += 1;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut done = std::mem::take(&mut *load.minute.lock().unwrap());
        let (rss, files, threads_now) = resources(pid);
        let latency = p99(&mut done.latencies_us);
        println!(
            "{minute},{rss},{files},{threads_now},{latency},{},{}",
            done.latencies_us.len(),
            done.errors.len()
        );
        assert!(
            done.errors.is_empty(),
            "minute {minute}: {:?}",
            &done.errors[..done.errors.len().min(5)]
        );
        assert!(
            !done.latencies_us.is_empty(),
            "minute {minute}: no request answered"
        );
        samples.push((rss, files, threads_now, latency));
    }
    load.stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }

    // Nothing grows without bound: after the first minute (the store filling, the pools
    // warming) the last sample stays near the first one's.
    if let [first, .., last] = samples[..] {
        let (rss0, files0, threads0, p99_0) = first;
        let (rss, files, threads_now, p99_last) = last;
        assert!(
            rss <= rss0 + rss0 / 2 + 16 * 1024,
            "RSS grew from {rss0} to {rss} KiB"
        );
        assert!(files <= files0 + 32, "open files grew from {files0} to {files}");
        assert!(
            threads_now <= threads0 + 4,
            "threads grew from {threads0} to {threads_now}"
        );
        assert!(
            p99_last <= p99_0 * 4 + 5_000,
            "p99 grew from {p99_0} to {p99_last} µs"
        );
    }
    println!("requests: {}", load.sent.load(Ordering::Relaxed));
}
